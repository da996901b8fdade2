//! The document-store outbox end to end: a real CouchDB-protocol server
//! (pouchdb-server, tests/common/couchdb.rs) holding documents with pending
//! outbox entries → the `couchdb` source → the store (SQLite or PostgreSQL)
//! → the WebAssembly `amqp` sink → RabbitMQ on 127.0.0.1:5672 → a real
//! consumer; then the `couchdb-mark` sink (chained `after = "amqp"`) marks
//! each entry published in its document.
//!
//! Each test owns its CouchDB server and database, its exchange and queues
//! (random names), and its outboxd database.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::couchdb::{document, entry, CouchServer};
use common::*;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outboxd::sources::SourceConfig;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);
const DB: &str = "documents";

fn amqp_url() -> String {
    std::env::var("OUTBOXD_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn unique(prefix: &str) -> String {
    format!(
        "outboxd-test-{prefix}-{}",
        hex::encode(rand::random::<[u8; 4]>())
    )
}

/// One consumed message.
#[derive(Debug, Clone)]
struct Got {
    message_id: Option<String>,
    routing_key: String,
    headers: std::collections::BTreeMap<String, String>,
    body: Vec<u8>,
}

async fn channel() -> (Connection, lapin::Channel) {
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("RabbitMQ must run on 127.0.0.1:5672 (scripts/setup.sh starts it)");
    let ch = conn.create_channel().await.unwrap();
    (conn, ch)
}

/// Declare topic exchange `exchange` (durable).
async fn declare_exchange(exchange: &str) {
    let (conn, ch) = channel().await;
    let opts = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.exchange_declare(
        exchange.into(),
        ExchangeKind::Topic,
        opts,
        FieldTable::default(),
    )
    .await
    .unwrap();
    let _ = conn.close(200, "declared".into()).await;
}

/// A durable queue bound to `exchange` with `binding`, consumed into `seen`.
struct Queue {
    name: String,
    seen: Arc<Mutex<Vec<Got>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Queue {
    async fn bind(exchange: &str, binding: &str) -> Queue {
        let name = unique("q");
        let (conn, ch) = channel().await;
        let opts = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare(name.as_str().into(), opts, FieldTable::default())
            .await
            .unwrap();
        ch.queue_bind(
            name.as_str().into(),
            exchange.into(),
            binding.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        let _ = conn.close(200, "bound".into()).await;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(consume(name.clone(), seen.clone()));
        Queue { name, seen, task }
    }

    fn seen(&self) -> Vec<Got> {
        self.seen.lock().unwrap().clone()
    }

    async fn wait_for(&self, n: usize) -> Vec<Got> {
        let seen = self.seen.clone();
        let ok = eventually(WAIT, || seen.lock().unwrap().len() >= n).await;
        assert!(ok, "only {} of {n} messages arrived", self.seen().len());
        self.seen()
    }

    async fn delete(self) {
        self.task.abort();
        let (conn, ch) = channel().await;
        let _ = ch
            .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = conn.close(200, "done".into()).await;
    }
}

async fn delete_exchange(exchange: &str) {
    let (conn, ch) = channel().await;
    let _ = ch
        .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
        .await;
    let _ = conn.close(200, "done".into()).await;
}

async fn consume(queue: String, seen: Arc<Mutex<Vec<Got>>>) {
    loop {
        let session = async {
            let (_conn, ch) = channel().await;
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

/// The `couchdb` source over `couch`'s database [`DB`], with short timers.
fn source(couch: &CouchServer, extra: Value) -> SourceConfig {
    let mut c = json!({
        "kind": "couchdb",
        "url": couch.url,
        "database": DB,
        "scan-interval": "2s",
        "feed-timeout": "1s",
        "request-timeout": "2s",
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    serde_json::from_value(c).unwrap()
}

/// The `amqp` sink (routing key from the entry) and the `couchdb-mark`
/// sink chained after it.
fn plugins(couch: &CouchServer, exchange: &str) -> PluginsDir {
    plugins_with(couch, exchange, "10s")
}

/// [`plugins`] with both sinks' deadline `deadline`.
fn plugins_with(couch: &CouchServer, exchange: &str, deadline: &str) -> PluginsDir {
    let plugins = PluginsDir::new();
    let built = built_plugins();
    plugins.add_component(
        "amqp",
        &built.join("amqp.wasm"),
        &format!(
            "[limits]\ndeadline = {deadline:?}\nmax-batch = 100\n\
             [capabilities]\namqp = {{ url = {:?}, exchanges = [{exchange:?}] }}\n\
             [retry]\nbase = \"100ms\"\ncap = \"500ms\"\n\
             [config]\nexchange = {exchange:?}\nrouting-key = \"{{routingkey}}\"\nunroutable = \"retry\"\n",
            amqp_url()
        ),
    );
    plugins.add_component(
        "couchdb-mark",
        &built.join("couchdb-mark.wasm"),
        &format!(
            "after = \"amqp\"\n\
             [limits]\ndeadline = {deadline:?}\nmax-batch = 50\n\
             [capabilities]\nhttp = [{url:?}]\n\
             [retry]\nbase = \"100ms\"\ncap = \"500ms\"\n\
             [config]\nurl = {url:?}\ndatabase = {DB:?}\n",
            url = couch.url
        ),
    );
    plugins
}

async fn start(plugins: &PluginsDir, db: &TestDb, source: SourceConfig) -> TestDaemon {
    let url = db.url.clone();
    TestDaemon::start_with(plugins.path(), move |c| {
        c.database_url = Some(url);
        c.sources.insert("docs".into(), source);
    })
    .await
}

/// The entry with `event_id` in document `id`.
async fn entry_of(couch: &CouchServer, id: &str, event_id: &str) -> Value {
    let doc = couch.get(DB, id).await.expect("document exists");
    doc["extensions"]["_server_outbox"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event_id"] == json!(event_id))
        .cloned()
        .unwrap_or_else(|| panic!("no entry {event_id} in {doc}"))
}

async fn wait_published(couch: &CouchServer, id: &str, event_id: &str) -> Value {
    let start = std::time::Instant::now();
    loop {
        let e = entry_of(couch, id, event_id).await;
        if e["status"] == json!("published") {
            return e;
        }
        assert!(
            start.elapsed() < WAIT,
            "entry {event_id} of {id} not marked: {e}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until `f` holds for `d`'s metrics text.
async fn wait_metric(d: &TestDaemon, what: &str, f: impl Fn(&str) -> bool) -> String {
    let start = std::time::Instant::now();
    loop {
        let text = d.metrics_text().await;
        if f(&text) {
            return text;
        }
        assert!(start.elapsed() < WAIT, "{what}: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

use common::both_stores;

both_stores!(
    a_new_entry_waits_for_its_exchange_then_is_published_once_and_marked,
    per_document_order_holds_through_a_restart,
);

async fn a_new_entry_waits_for_its_exchange_then_is_published_once_and_marked(backend: Backend) {
    let couch = CouchServer::start().await;
    couch.create_db(DB).await;
    let exchange = unique("x");
    let plugins = plugins(&couch, &exchange);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, source(&couch, json!({}))).await;

    let e = entry("evt-new-1", "person-1", 1, "new", "person");
    couch
        .save(
            DB,
            "person-1",
            &document("person", json!({"name": "Ada"}), &[e]),
        )
        .await;
    // The exchange does not exist: the publish is refused and retried, the
    // entry stays pending.
    wait_event(&d, "evt-new-1").await;
    d.wait_sink("evt-new-1", "amqp", WAIT, |x| {
        x["attempts"].as_u64() >= Some(2)
    })
    .await;
    assert_eq!(
        entry_of(&couch, "person-1", "evt-new-1").await["status"],
        json!("pending")
    );
    let mark = d.delivery("evt-new-1", "couchdb-mark").await.unwrap();
    assert_eq!(
        mark["attempts"],
        json!(0),
        "not marked before the publish: {mark}"
    );
    // The scans see it pending (created_at lies in the past).
    wait_metric(&d, "oldest pending age shown", |t| {
        gauge(t, "outboxd_source_oldest_pending_age_seconds").is_some_and(|v| v > 1.0)
    })
    .await;

    declare_exchange(&exchange).await;
    let queue = Queue::bind(&exchange, "documents.new.#").await;
    let marked = wait_published(&couch, "person-1", "evt-new-1").await;
    assert!(marked["published_at"].is_string(), "{marked}");
    let got = queue.wait_for(1).await;
    assert_eq!(got[0].message_id.as_deref(), Some("evt-new-1"));
    assert_eq!(got[0].routing_key, "documents.new.person");
    assert_eq!(got[0].headers["cloudEvents_partitionkey"], "person-1");
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body["document_id"], json!("person-1"));
    // Marking changed the document: the feed and the scans read it again,
    // and nothing is published a second time.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(queue.seen().len(), 1, "{:?}", queue.seen());
    let doc = couch.get(DB, "person-1").await.unwrap();
    assert_eq!(doc["body"]["name"], json!("Ada"), "the document is kept");
    let rev = doc["_rev"].as_str().unwrap();
    assert!(rev.starts_with("2-"), "saved once, marked once: {rev}");
    let text = wait_metric(&d, "nothing pending after the mark", |t| {
        gauge(t, "outboxd_source_oldest_pending_age_seconds") == Some(0.0)
    })
    .await;
    assert!(
        gauge(&text, "outboxd_source_checkpoint_lag_seconds").is_some(),
        "{text}"
    );
    assert!(
        text.contains(r#"outboxd_source_entries_total{source="docs",outcome="relayed"} 1"#),
        "{text}"
    );
    assert_eq!(
        doc["extensions"]["_server_outbox"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    d.stop().await;
    queue.delete().await;
    delete_exchange(&exchange).await;
    db.cleanup().await;
}

async fn per_document_order_holds_through_a_restart(backend: Backend) {
    let couch = CouchServer::start().await;
    couch.create_db(DB).await;
    let exchange = unique("x");
    let plugins = plugins(&couch, &exchange);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, source(&couch, json!({}))).await;

    // Entry 1 of two documents, while the exchange is missing.
    let a1 = entry("a-1", "doc-a", 1, "new", "person");
    let b1 = entry("b-1", "doc-b", 1, "new", "person");
    let rev_a = couch
        .save(
            DB,
            "doc-a",
            &document("person", json!({}), std::slice::from_ref(&a1)),
        )
        .await;
    let rev_b = couch
        .save(
            DB,
            "doc-b",
            &document("person", json!({}), std::slice::from_ref(&b1)),
        )
        .await;
    wait_event(&d, "a-1").await;
    d.wait_sink("a-1", "amqp", WAIT, |x| x["attempts"].as_u64() >= Some(1))
        .await;
    wait_event(&d, "b-1").await;
    d.wait_sink("b-1", "amqp", WAIT, |x| x["attempts"].as_u64() >= Some(1))
        .await;
    d.stop().await;

    // While outboxd is down, entries 2 and 3 are added, interleaved.
    let a2 = entry("a-2", "doc-a", 2, "updated", "person");
    let b2 = entry("b-2", "doc-b", 2, "updated", "person");
    let a3 = entry("a-3", "doc-a", 3, "updated", "person");
    let mut doc = document("person", json!({}), &[a1.clone(), a2.clone()]);
    doc["_rev"] = json!(rev_a);
    let rev_a = couch.save(DB, "doc-a", &doc).await;
    let mut doc = document("person", json!({}), &[b1, b2]);
    doc["_rev"] = json!(rev_b);
    couch.save(DB, "doc-b", &doc).await;
    let mut doc = document("person", json!({}), &[a1, a2, a3]);
    doc["_rev"] = json!(rev_a);
    couch.save(DB, "doc-a", &doc).await;

    declare_exchange(&exchange).await;
    let queue = Queue::bind(&exchange, "documents.#").await;
    let d = start(&plugins, &db, source(&couch, json!({}))).await;
    for (doc, id) in [
        ("doc-a", "a-1"),
        ("doc-a", "a-2"),
        ("doc-a", "a-3"),
        ("doc-b", "b-1"),
        ("doc-b", "b-2"),
    ] {
        wait_published(&couch, doc, id).await;
    }
    let got = queue.wait_for(5).await;
    let order = |stream: &str| -> Vec<String> {
        let mut ids: Vec<String> = Vec::new();
        for g in got
            .iter()
            .filter(|g| g.headers["cloudEvents_partitionkey"] == stream)
        {
            let id = g.message_id.clone().unwrap();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    };
    assert_eq!(order("doc-a"), ["a-1", "a-2", "a-3"]);
    assert_eq!(order("doc-b"), ["b-1", "b-2"]);
    let keys: Vec<&str> = got.iter().map(|g| g.routing_key.as_str()).collect();
    assert!(keys.contains(&"documents.updated.person"), "{keys:?}");

    d.stop().await;
    queue.delete().await;
    delete_exchange(&exchange).await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_update_is_published_with_its_routing_key_and_ingress_routes_never_mix() {
    let couch = CouchServer::start().await;
    couch.create_db(DB).await;
    let exchange = unique("x");
    declare_exchange(&exchange).await;
    let downstream = Queue::bind(&exchange, "documents.*.person").await;
    let ingress = Queue::bind(&exchange, "documents.ingest.#").await;
    let update_ingress = Queue::bind(&exchange, "documents.update.#").await;
    let plugins = plugins(&couch, &exchange);
    let db = TestDb::new(Backend::Sqlite).await;
    let d = start(&plugins, &db, source(&couch, json!({}))).await;

    let mut first = entry("u-1", "p-9", 1, "new", "person");
    first["status"] = json!("published");
    let second = entry("u-2", "p-9", 2, "updated", "person");
    couch
        .save(
            DB,
            "p-9",
            &document("person", json!({"v": 2}), &[first, second]),
        )
        .await;
    wait_published(&couch, "p-9", "u-2").await;
    let got = downstream.wait_for(1).await;
    assert_eq!(got[0].message_id.as_deref(), Some("u-2"));
    assert_eq!(got[0].routing_key, "documents.updated.person");
    assert_eq!(got[0].headers["cloudEvents_operation"], "updated");
    // The entry published before outboxd saw the document is not relayed.
    let (status, _) = d.get("/v1/events/u-1").await;
    assert_eq!(status, 404);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(downstream.seen().len(), 1);
    assert!(ingress.seen().is_empty(), "{:?}", ingress.seen());
    assert!(
        update_ingress.seen().is_empty(),
        "{:?}",
        update_ingress.seen()
    );

    d.stop().await;
    for q in [downstream, ingress, update_ingress] {
        q.delete().await;
    }
    delete_exchange(&exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_409_storm_while_marking_keeps_the_other_writers_changes() {
    let couch = Arc::new(CouchServer::start().await);
    couch.create_db(DB).await;
    let exchange = unique("x");
    declare_exchange(&exchange).await;
    let queue = Queue::bind(&exchange, "documents.#").await;
    let plugins = plugins(&couch, &exchange);
    let db = TestDb::new(Backend::Sqlite).await;

    let e = entry("storm-1", "busy", 1, "new", "person");
    couch
        .save(DB, "busy", &document("person", json!({"counter": 0}), &[e]))
        .await;
    // Another writer updates the document in a loop: read, bump, save.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (couch, stop) = (couch.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut saved, mut conflicts) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut doc = couch.get(DB, "busy").await.unwrap();
                let next = doc["body"]["counter"].as_u64().unwrap() + 1;
                doc["body"]["counter"] = json!(next);
                match couch.put(DB, "busy", &doc).await.0 {
                    201 => saved = next,
                    409 => conflicts += 1,
                    s => panic!("writer: HTTP {s}"),
                }
            }
            (saved, conflicts)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let d = start(&plugins, &db, source(&couch, json!({}))).await;
    wait_published(&couch, "busy", "storm-1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (saved, _) = writer.await.unwrap();
    let doc = couch.get(DB, "busy").await.unwrap();
    assert_eq!(
        doc["body"]["counter"],
        json!(saved),
        "the writer's last save is kept: {doc}"
    );
    let e = &doc["extensions"]["_server_outbox"][0];
    assert_eq!(e["status"], json!("published"), "{doc}");
    assert!(saved > 3, "the writer kept writing ({saved} saves)");
    // The mark met conflicts (the writer's saves) and still finished.
    let mark = d.delivery("storm-1", "couchdb-mark").await.unwrap();
    assert_eq!(mark["status"], json!("delivered"), "{mark}");
    let ids: Vec<_> = queue
        .seen()
        .iter()
        .filter_map(|g| g.message_id.clone())
        .collect();
    assert!(
        ids.iter().all(|i| i == "storm-1") && !ids.is_empty(),
        "{ids:?}"
    );

    d.stop().await;
    queue.delete().await;
    delete_exchange(&exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pending_view_lists_exactly_the_pending_entries_and_an_outdated_one_is_replaced() {
    let couch = CouchServer::start().await;
    couch.create_db(DB).await;
    // An outdated design document of ours (another map function).
    couch
        .save(
            DB,
            "_design/outboxd",
            &json!({ "language": "javascript", "views": { "pending": { "map": "function (doc) { emit(doc._id, null); }" } } }),
        )
        .await;
    let pending = |id: &str, doc: &str, seq: u64| entry(id, doc, seq, "new", "person");
    let mut published = entry("p", "d1", 2, "new", "person");
    published["status"] = json!("published");
    let mut no_status = entry("n", "d3", 1, "new", "person");
    no_status.as_object_mut().unwrap().remove("status");
    let docs = vec![
        (
            "d1",
            document(
                "person",
                json!({}),
                &[pending("a", "d1", 1), published, pending("c", "d1", 3)],
            ),
        ),
        (
            "d2",
            document("person", json!({}), &[pending("x", "d2", 7)]),
        ),
        ("d3", document("person", json!({}), &[no_status])),
        (
            "d4",
            json!({ "extensions": { "_server_outbox": "not a list" } }),
        ),
        ("d5", json!({ "type": "no outbox" })),
    ];
    for (id, doc) in &docs {
        couch.save(DB, id, doc).await;
    }
    // What the view must return, worked out from the documents themselves.
    let mut expected: Vec<(String, u64)> = Vec::new();
    for (id, doc) in &docs {
        if let Some(list) = doc["extensions"]["_server_outbox"].as_array() {
            for e in list {
                if e["status"] == json!("pending") {
                    expected.push((id.to_string(), e["sequence"].as_u64().unwrap()));
                }
            }
        }
    }
    expected.sort();

    let plugins = PluginsDir::new();
    let db = TestDb::new(Backend::Sqlite).await;
    let d = start(&plugins, &db, source(&couch, json!({}))).await;
    let start = std::time::Instant::now();
    let rows = loop {
        let (status, body) = couch
            .get_path(&format!("{DB}/_design/outboxd/_view/pending"))
            .await;
        if status == 200
            && body["rows"]
                .as_array()
                .is_some_and(|r| r.iter().all(|r| r["key"].is_array()))
        {
            break body["rows"].as_array().unwrap().clone();
        }
        assert!(
            start.elapsed() < WAIT,
            "view not installed: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let got: Vec<(String, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["key"][0].as_str().unwrap().to_string(),
                r["key"][1].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, expected);
    assert!(rows.iter().all(|r| r["id"] == r["key"][0]));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_entries_are_counted_and_never_ingested_and_the_rest_is_relayed() {
    let couch = CouchServer::start().await;
    couch.create_db(DB).await;
    let exchange = unique("x");
    declare_exchange(&exchange).await;
    let queue = Queue::bind(&exchange, "documents.#").await;
    let plugins = plugins(&couch, &exchange);
    let db = TestDb::new(Backend::Sqlite).await;

    let mut no_id = entry("bad-1", "bad", 1, "new", "person");
    no_id.as_object_mut().unwrap().remove("event_id");
    let mut zero = entry("bad-2", "bad2", 0, "new", "person");
    zero["sequence"] = json!(0);
    let mut text = entry("bad-3", "bad3", 1, "new", "person");
    text["payload"] = json!("{not json");
    couch
        .save(DB, "bad", &document("person", json!({}), &[no_id]))
        .await;
    couch
        .save(DB, "bad2", &document("person", json!({}), &[zero]))
        .await;
    couch
        .save(DB, "bad3", &document("person", json!({}), &[text]))
        .await;
    couch
        .save(
            DB,
            "good",
            &document(
                "person",
                json!({}),
                &[entry("good-1", "good", 1, "new", "person")],
            ),
        )
        .await;
    let d = start(&plugins, &db, source(&couch, json!({}))).await;
    wait_published(&couch, "good", "good-1").await;
    let text = wait_metric(&d, "three malformed entries counted", |t| {
        t.contains(r#"outboxd_source_entries_total{source="docs",outcome="malformed"} 3"#)
    })
    .await;
    assert!(
        text.contains(r#"outboxd_source_entries_total{source="docs",outcome="relayed"} 1"#),
        "{text}"
    );
    for id in ["bad-2", "bad-3"] {
        assert_eq!(
            d.get(&format!("/v1/events/{id}")).await.0,
            404,
            "{id} ingested"
        );
    }
    assert_eq!(
        entry_of(&couch, "bad2", "bad-2").await["status"],
        json!("pending")
    );
    // Scans and the feed read them again: still counted once per revision.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(d.metrics_text().await.contains(r#"outcome="malformed"} 3"#));
    let ids: Vec<_> = queue
        .seen()
        .iter()
        .filter_map(|g| g.message_id.clone())
        .collect();
    assert_eq!(ids, ["good-1"]);

    d.stop().await;
    queue.delete().await;
    delete_exchange(&exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_checkpoint_past_an_entry_never_skips_it() {
    let couch = CouchServer::start().await;
    couch.create_db(DB).await;
    couch
        .save(
            DB,
            "old",
            &document(
                "person",
                json!({}),
                &[entry("old-1", "old", 1, "new", "person")],
            ),
        )
        .await;
    let db = TestDb::new(Backend::Sqlite).await;
    // A checkpoint far past everything the database holds.
    let store = db.store().await;
    let checkpoint = json!({ "database": format!("{}/{DB}", couch.url), "since": 1_000_000 });
    store
        .save_source_checkpoint("docs", &checkpoint.to_string())
        .await
        .unwrap();
    drop(store);
    let plugins = PluginsDir::new();
    let d = start(&plugins, &db, source(&couch, json!({}))).await;
    let start = std::time::Instant::now();
    while d.get("/v1/events/old-1").await.0 != 200 {
        assert!(start.elapsed() < WAIT, "old-1 never relayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, ev) = d.get("/v1/events/old-1").await;
    assert_eq!(ev["event"]["partitionkey"], json!("old"));
    assert_eq!(ev["event"]["sequence"], json!(1));
    assert_eq!(ev["event"]["type"], json!("documents.new.person"));
    assert_eq!(ev["event"]["routingkey"], json!("documents.new.person"));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_feed_relays_new_work_and_keeps_its_checkpoint_in_the_store() {
    let couch = CouchServer::start().await;
    couch.create_db(DB).await;
    let db = TestDb::new(Backend::Sqlite).await;
    let plugins = PluginsDir::new();
    // A scan interval far longer than the test: only the feed can find it.
    let d = start(
        &plugins,
        &db,
        source(&couch, json!({ "scan-interval": "1h" })),
    )
    .await;
    let (_, ready) = wait_ready(&d).await;
    assert_eq!(
        ready["checks"]["sources"]["sources"]["docs"]["ok"],
        json!(true),
        "{ready}"
    );
    couch
        .save(
            DB,
            "fresh",
            &document(
                "person",
                json!({}),
                &[entry("fresh-1", "fresh", 1, "new", "person")],
            ),
        )
        .await;
    let start = std::time::Instant::now();
    while d.get("/v1/events/fresh-1").await.0 != 200 {
        assert!(
            start.elapsed() < WAIT,
            "fresh-1 never relayed from the feed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let store = db.store().await;
    let start = std::time::Instant::now();
    loop {
        let cp = store.source_checkpoint("docs").await.unwrap();
        if let Some(cp) = cp {
            let cp: Value = serde_json::from_str(&cp).unwrap();
            assert_eq!(cp["database"], json!(format!("{}/{DB}", couch.url)));
            break;
        }
        assert!(start.elapsed() < WAIT, "no checkpoint saved");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    d.stop().await;
}

/// The value of gauge `name{source="docs"}` in a metrics text.
fn gauge(text: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name}{{source=\"docs\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Wait until event `id` is stored.
async fn wait_event(d: &TestDaemon, id: &str) -> Value {
    let start = std::time::Instant::now();
    loop {
        let (status, body) = d.get(&format!("/v1/events/{id}")).await;
        if status == 200 {
            return body;
        }
        assert!(start.elapsed() < WAIT, "event {id} never relayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_ready(d: &TestDaemon) -> (u16, Value) {
    let start = std::time::Instant::now();
    loop {
        let (status, body) = d.get("/ready").await;
        if status == 200 {
            return (status, body);
        }
        assert!(start.elapsed() < WAIT, "never ready: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_shows_couchdb_unreachable_while_health_stays_up() {
    let mut couch = CouchServer::start().await;
    couch.create_db(DB).await;
    let db = TestDb::new(Backend::Sqlite).await;
    let plugins = PluginsDir::new();
    let d = start(&plugins, &db, source(&couch, json!({}))).await;
    wait_ready(&d).await;
    couch.kill();
    let start = std::time::Instant::now();
    let body = loop {
        let (status, body) = d.get("/ready").await;
        if status == 503 {
            break body;
        }
        assert!(
            start.elapsed() < WAIT,
            "still ready with CouchDB gone: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let docs = &body["checks"]["sources"]["sources"]["docs"];
    assert_eq!(docs["ok"], json!(false), "{body}");
    assert!(
        docs["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("CouchDB"),
        "{body}"
    );
    assert_eq!(d.get("/health").await.0, 200, "the daemon itself is fine");
    d.stop().await;
}

#[test]
fn a_bad_source_key_is_refused_at_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("outboxd.toml");
    let load = |text: &str| {
        std::fs::write(&file, text).unwrap();
        outboxd::config::Config::load(Some(&file), json!({}))
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let base = "[sources.docs]\nkind = \"couchdb\"\nurl = \"http://127.0.0.1:5984\"\ndatabase = \"documents\"\n";
    let e = load(&format!("{base}scan-intervall = \"5s\"\n"));
    assert!(e.contains("scan-intervall"), "{e}");
    let e = load(&format!("{base}[sources.docs.paths]\nevent_id = \"id\"\n"));
    assert!(e.contains("event_id"), "{e}");
    let e = load("[sources.docs]\nkind = \"couchbase\"\n");
    assert!(e.contains("couchbase"), "{e}");
    let e = load(&base.replace(
        "http://127.0.0.1:5984",
        "http://admin:secret@127.0.0.1:5984",
    ));
    assert!(
        e.contains("sources.docs.url") && !e.contains("secret"),
        "{e}"
    );
    let e = load(&format!("{base}scan-interval = \"0s\"\n"));
    assert!(e.contains("sources.docs.scan-interval"), "{e}");
    let e = load(&format!("{base}username-env = \"COUCH_USER\"\n"));
    assert!(e.contains("sources.docs.password-env"), "{e}");
    assert!(outboxd::config::Config::load(
        Some(&{
            std::fs::write(&file, base).unwrap();
            file.clone()
        }),
        json!({})
    )
    .is_ok());
}

#[test]
fn the_shipped_example_configuration_loads() {
    let file = repo_root().join("deploy/couchdb-outbox/outboxd.toml");
    let config =
        outboxd::config::Config::load(Some(&file), json!({})).expect("deploy example loads");
    assert_eq!(config.sources["documents"].kind(), "couchdb");
    for manifest in ["amqp.toml", "couchdb-mark.toml"] {
        let text =
            std::fs::read_to_string(repo_root().join("deploy/couchdb-outbox").join(manifest))
                .unwrap();
        let value: toml::Value = toml::from_str(&text).unwrap();
        assert!(value.get("name").is_some(), "{manifest}");
    }
    let mark = std::fs::read_to_string(repo_root().join("deploy/couchdb-outbox/couchdb-mark.toml"))
        .unwrap();
    assert!(mark.contains("after = \"amqp\""));
}

/// Lease of the crash tests' child daemons: the least the 2 s sink
/// deadline allows (2 × 2 s + 5 s), so a killed daemon's leases run out
/// soon after the restart.
const CRASH_LEASE: &str = "9s";

/// `outboxd` as a child process with the couchdb source configured by
/// environment variables.
fn child_config(
    couch: &CouchServer,
    plugins: &PluginsDir,
    db: &TestDb,
    data: &std::path::Path,
    log: &str,
) -> ChildConfig {
    let env = [
        ("OUTBOXD_DELIVERY__LEASE", CRASH_LEASE),
        ("OUTBOXD_DELIVERY__MAX_POLL_INTERVAL", "200ms"),
        ("OUTBOXD_SOURCES__DOCS__KIND", "couchdb"),
        ("OUTBOXD_SOURCES__DOCS__URL", couch.url.as_str()),
        ("OUTBOXD_SOURCES__DOCS__DATABASE", DB),
        ("OUTBOXD_SOURCES__DOCS__SCAN_INTERVAL", "2s"),
        ("OUTBOXD_SOURCES__DOCS__FEED_TIMEOUT", "1s"),
        ("OUTBOXD_SOURCES__DOCS__REQUEST_TIMEOUT", "2s"),
    ];
    ChildConfig {
        listen: free_loopback_addr(),
        database_url: db.url.clone(),
        plugins_dir: plugins.path().to_path_buf(),
        data_dir: data.to_path_buf(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        log: child_log(log),
    }
}

/// `GET path` of a child daemon, as JSON.
async fn child_get(base: &str, path: &str) -> (u16, Value) {
    let r = reqwest::get(format!("{base}{path}")).await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Wait until `check` holds for the delivery of `id` to `sink`.
async fn child_wait_sink(base: &str, id: &str, sink: &str, check: impl Fn(&Value) -> bool) {
    let start = std::time::Instant::now();
    loop {
        let (_, body) = child_get(base, &format!("/v1/events/{id}")).await;
        let d = body["deliveries"]
            .as_array()
            .and_then(|ds| ds.iter().find(|d| d["sink"] == json!(sink)).cloned());
        if d.as_ref().is_some_and(&check) {
            return;
        }
        assert!(start.elapsed() < WAIT, "delivery of {id} to {sink}: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// After the restart: marked once (the document's second revision), and
/// every message carries the one event id (a repeat publish is allowed).
async fn assert_published_once_marked_once(
    couch: &CouchServer,
    queue: &Queue,
    doc: &str,
    id: &str,
) {
    wait_published(couch, doc, id).await;
    let got = queue.wait_for(1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ids: Vec<_> = queue.seen().iter().map(|g| g.message_id.clone()).collect();
    assert!(
        !got.is_empty() && ids.iter().all(|m| m.as_deref() == Some(id)),
        "{ids:?}"
    );
    let rev = couch.get(DB, doc).await.unwrap()["_rev"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(rev.starts_with("2-"), "saved once and marked once: {rev}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_between_relay_and_publish_the_entry_is_published_and_marked_after_restart() {
    let couch = CouchServer::start().await;
    couch.create_db(DB).await;
    let exchange = unique("x");
    let plugins = plugins_with(&couch, &exchange, "2s");
    let db = TestDb::new(Backend::Sqlite).await;
    let data = tempfile::tempdir().unwrap();
    let config = child_config(&couch, &plugins, &db, data.path(), "couchdb-kill-relay");
    let mut child = ChildDaemon::spawn(&config);
    child.wait_healthy(WAIT).await;
    couch
        .save(
            DB,
            "k-1",
            &document(
                "person",
                json!({}),
                &[entry("kill-1", "k-1", 1, "new", "person")],
            ),
        )
        .await;
    // Relayed (stored), the publish failing: the exchange is missing.
    child_wait_sink(&child.base, "kill-1", "amqp", |d| {
        d["attempts"].as_u64() >= Some(1)
    })
    .await;
    child.kill();
    declare_exchange(&exchange).await;
    let queue = Queue::bind(&exchange, "documents.#").await;
    let mut child = ChildDaemon::spawn(&config);
    child.wait_healthy(WAIT).await;
    assert_published_once_marked_once(&couch, &queue, "k-1", "kill-1").await;
    child.kill();
    queue.delete().await;
    delete_exchange(&exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_between_publish_and_mark_the_entry_is_marked_once_after_restart() {
    let couch = CouchServer::start().await;
    couch.create_db(DB).await;
    let exchange = unique("x");
    declare_exchange(&exchange).await;
    let queue = Queue::bind(&exchange, "documents.#").await;
    let plugins = plugins_with(&couch, &exchange, "2s");
    let db = TestDb::new(Backend::Sqlite).await;
    let data = tempfile::tempdir().unwrap();
    let config = child_config(&couch, &plugins, &db, data.path(), "couchdb-kill-mark");
    let mut child = ChildDaemon::spawn(&config);
    child.wait_healthy(WAIT).await;
    // Hold the mark back (the pause is kept in the store) so the kill falls
    // between the confirmed publish and the mark.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/admin/sinks/couchdb-mark/pause", child.base))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "pause: {}", r.status());
    couch
        .save(
            DB,
            "k-2",
            &document(
                "person",
                json!({}),
                &[entry("kill-2", "k-2", 1, "new", "person")],
            ),
        )
        .await;
    child_wait_sink(&child.base, "kill-2", "amqp", |d| {
        d["status"] == json!("delivered")
    })
    .await;
    queue.wait_for(1).await;
    assert_eq!(
        entry_of(&couch, "k-2", "kill-2").await["status"],
        json!("pending")
    );
    child.kill();
    let mut child = ChildDaemon::spawn(&config);
    child.wait_healthy(WAIT).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/admin/sinks/couchdb-mark/resume", child.base))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "resume: {}", r.status());
    assert_published_once_marked_once(&couch, &queue, "k-2", "kill-2").await;
    child.kill();
    queue.delete().await;
    delete_exchange(&exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_entry_published_meanwhile_or_a_deleted_document_is_success_without_a_write() {
    let couch = CouchServer::start().await;
    couch.create_db(DB).await;
    let exchange = unique("x");
    declare_exchange(&exchange).await;
    let queue = Queue::bind(&exchange, "documents.#").await;
    let plugins = plugins(&couch, &exchange);
    let db = TestDb::new(Backend::Sqlite).await;
    let d = start(&plugins, &db, source(&couch, json!({}))).await;
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/v1/admin/sinks/couchdb-mark/pause", d.base))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let e1 = entry("meanwhile-1", "m-1", 1, "new", "person");
    let e2 = entry("gone-1", "m-2", 1, "new", "person");
    couch
        .save(DB, "m-1", &document("person", json!({}), &[e1]))
        .await;
    let rev2 = couch
        .save(DB, "m-2", &document("person", json!({}), &[e2]))
        .await;
    queue.wait_for(2).await;
    // Meanwhile another marker publishes m-1's entry, and m-2 is deleted.
    let mut doc = couch.get(DB, "m-1").await.unwrap();
    doc["extensions"]["_server_outbox"][0]["status"] = json!("published");
    doc["extensions"]["_server_outbox"][0]["published_at"] = json!("2026-12-01T11:00:00.000Z");
    let rev1 = couch.save(DB, "m-1", &doc).await;
    couch.delete(DB, "m-2", &rev2).await;
    let r = http
        .post(format!("{}/v1/admin/sinks/couchdb-mark/resume", d.base))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    for id in ["meanwhile-1", "gone-1"] {
        d.wait_sink(id, "couchdb-mark", WAIT, |x| {
            x["status"] == json!("delivered")
        })
        .await;
    }
    let doc = couch.get(DB, "m-1").await.unwrap();
    assert_eq!(doc["_rev"], json!(rev1), "not written again: {doc}");
    assert_eq!(
        doc["extensions"]["_server_outbox"][0]["published_at"],
        json!("2026-12-01T11:00:00.000Z")
    );
    assert!(
        couch.get(DB, "m-2").await.is_none(),
        "the deleted document stays deleted"
    );
    d.stop().await;
    queue.delete().await;
    delete_exchange(&exchange).await;
}

/// The document service's own publisher, as its protocol goes: each
/// pending entry of a document, in sequence order, published (confirmed)
/// with its routing key and the event id as message id, then marked
/// `published` in a new revision of its document (re-read and tried again
/// on 409; an entry found published already is left as it is — someone
/// else published and marked it). Runs until `stop` turns true.
async fn document_service_publisher(couch_url: String, exchange: String, stop: Arc<AtomicBool>) {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let (_conn, ch) = channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    while !stop.load(Ordering::Relaxed) {
        let all: Value = match http
            .get(format!("{couch_url}/{DB}/_all_docs?include_docs=true"))
            .send()
            .await
        {
            Ok(r) => r.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        for row in all["rows"].as_array().cloned().unwrap_or_default() {
            let id = row["id"].as_str().unwrap_or("").to_string();
            if id.starts_with("_design/") {
                continue;
            }
            let mut entries = row["doc"]["extensions"]["_server_outbox"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            entries.sort_by_key(|e| e["sequence"].as_u64());
            for e in entries.iter().filter(|e| e["status"] == "pending") {
                let event_id = e["event_id"].as_str().unwrap().to_string();
                let props =
                    lapin::BasicProperties::default().with_message_id(event_id.as_str().into());
                let published = async {
                    ch.basic_publish(
                        exchange.as_str().into(),
                        e["routing_key"].as_str().unwrap().into(),
                        BasicPublishOptions::default(),
                        e["payload"].to_string().as_bytes(),
                        props,
                    )
                    .await?
                    .await
                }
                .await;
                if !matches!(published, Ok(c) if c.is_ack()) {
                    break; // the next entries of this document wait
                }
                if !mark_published(&http, &couch_url, &id, &event_id).await {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `published_at` the test's document-service publisher writes (a
/// fixed time, so its marks are told from outboxd's).
const PUBLISHER_MARK: &str = "2026-12-04T12:00:00.000Z";

/// Mark `event_id` published in document `id`, re-reading on 409; false
/// when CouchDB failed otherwise.
async fn mark_published(http: &reqwest::Client, couch_url: &str, id: &str, event_id: &str) -> bool {
    for _ in 0..20 {
        let Ok(r) = http.get(format!("{couch_url}/{DB}/{id}")).send().await else {
            return false;
        };
        let Ok(mut doc) = r.json::<Value>().await else {
            return false;
        };
        let Some(entry) = doc["extensions"]["_server_outbox"]
            .as_array_mut()
            .and_then(|es| es.iter_mut().find(|e| e["event_id"] == event_id))
        else {
            return true;
        };
        if entry["status"] == "published" {
            return true;
        }
        entry["status"] = json!("published");
        entry["published_at"] = json!(PUBLISHER_MARK);
        match http
            .put(format!("{couch_url}/{DB}/{id}"))
            .json(&doc)
            .send()
            .await
        {
            Ok(r) if r.status().as_u16() == 409 => continue,
            Ok(r) => return r.status().is_success(),
            Err(_) => return false,
        }
    }
    false
}

/// Append entry `sequence` to document `id` in a new revision, as the
/// document service does on a mutation (re-read on 409).
async fn append_entry(couch: &CouchServer, id: &str, sequence: u64) {
    let event_id = format!("{id}-e{sequence:03}");
    loop {
        let mut doc = couch.get(DB, id).await.unwrap();
        let e = entry(&event_id, id, sequence, "updated", "person");
        doc["extensions"]["_server_outbox"]
            .as_array_mut()
            .unwrap()
            .push(e.clone());
        doc["extensions"]["_server_mutations"][e["mutation_id"].as_str().unwrap()] =
            e["content_hash"].clone();
        let (status, body) = couch.put(DB, id, &doc).await;
        match status {
            201 | 202 => return,
            409 => continue,
            _ => panic!("append to {id}: {status} {body}"),
        }
    }
}

/// The admin of the takeover test's CouchDB, given to the deployed
/// configuration as `COUCHDB_USER` / `COUCHDB_PASSWORD`.
const DEPLOY_USER: &str = "outboxd";
const DEPLOY_PASSWORD: &str = "relay-secret";

/// `deploy/couchdb-outbox/`'s `amqp.toml` and `couchdb-mark.toml` as
/// shipped, with the test's 2 s sink deadline (a SIGKILLed daemon's
/// deliveries come back when its 9 s lease runs out).
fn deployed_plugins() -> PluginsDir {
    let plugins = PluginsDir::new();
    let built = built_plugins();
    for sink in ["amqp", "couchdb-mark"] {
        std::fs::copy(
            built.join(format!("{sink}.wasm")),
            plugins.path().join(format!("{sink}.wasm")),
        )
        .unwrap();
        let manifest =
            std::fs::read_to_string(repo_root().join(format!("deploy/couchdb-outbox/{sink}.toml")))
                .unwrap();
        assert!(manifest.contains("deadline = \"30s\""), "{manifest}");
        std::fs::write(
            plugins.path().join(format!("{sink}.toml")),
            manifest.replace("deadline = \"30s\"", "deadline = \"2s\""),
        )
        .unwrap();
    }
    plugins
}

/// `deploy/couchdb-outbox/outboxd.toml` as shipped, pointed at `couch`
/// (with its admin's credentials) and RabbitMQ through the environment its
/// files name, with the test's short timers.
fn deployed_config(
    couch: &CouchServer,
    plugins: &PluginsDir,
    db: &TestDb,
    data: &std::path::Path,
    log: &str,
) -> ChildConfig {
    let file = repo_root().join("deploy/couchdb-outbox/outboxd.toml");
    let env = [
        ("OUTBOXD_CONFIG", file.display().to_string()),
        ("OUTBOXD_SOURCES__DOCUMENTS__URL", couch.url.clone()),
        ("OUTBOXD_SOURCES__DOCUMENTS__SCAN_INTERVAL", "2s".into()),
        ("OUTBOXD_SOURCES__DOCUMENTS__FEED_TIMEOUT", "1s".into()),
        ("OUTBOXD_SOURCES__DOCUMENTS__REQUEST_TIMEOUT", "2s".into()),
        ("COUCHDB_URL", couch.url.clone()),
        ("COUCHDB_USER", DEPLOY_USER.into()),
        ("COUCHDB_PASSWORD", DEPLOY_PASSWORD.into()),
        ("OUTBOXD_AMQP_URL", amqp_url()),
        ("OUTBOXD_DELIVERY__LEASE", CRASH_LEASE.into()),
        ("OUTBOXD_DELIVERY__MAX_POLL_INTERVAL", "200ms".into()),
    ];
    ChildConfig {
        listen: free_loopback_addr(),
        database_url: db.url.clone(),
        plugins_dir: plugins.path().to_path_buf(),
        data_dir: data.to_path_buf(),
        env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        log: child_log(log),
    }
}

/// Taking over from the document service's own publisher, with the files
/// of `deploy/couchdb-outbox/` against a CouchDB that requires its admin's
/// credentials for design documents. The publisher runs alone, then beside
/// outboxd (SIGKILLed three times) while the service keeps writing
/// revisions; then outboxd alone publishes and marks what the service
/// writes next (the publisher's marks carry a fixed `published_at`,
/// outboxd's the time of marking); then, while the service
/// writes more, outboxd is killed mid-flight and the service's publisher
/// finishes (handing back). Every entry reaches the consumer, the first
/// arrivals of each document in sequence order, every entry ends
/// `published`, and no entry is marked twice (each document has exactly one
/// revision per write and one per mark).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_document_services_publisher_beside_outboxd_then_handed_back_loses_nothing() {
    const DOCS: usize = 12;
    /// Entries per document written while the service's publisher runs,
    /// ...
    const BEFORE: u64 = 6;
    /// ... up to this one while outboxd runs alone ...
    const ALONE: u64 = 9;
    /// ... and the rest while it is handed back.
    const ENTRIES: u64 = 12;
    let couch = Arc::new(CouchServer::start().await);
    couch.create_db(DB).await;
    couch.add_admin(DEPLOY_USER, DEPLOY_PASSWORD).await;
    // The deploy files' exchange; no other test publishes to it.
    let exchange = "documents".to_string();
    declare_exchange(&exchange).await;
    let queue = Queue::bind(&exchange, "documents.#").await;
    let plugins = deployed_plugins();
    let db = TestDb::new(Backend::Sqlite).await;
    let data = tempfile::tempdir().unwrap();
    let config = deployed_config(&couch, &plugins, &db, data.path(), "couchdb-takeover");
    let doc_id = |d: usize| format!("t-{d:02}");

    // The document service: each document created with its first entry,
    // then one mutation after another.
    for d in 0..DOCS {
        let id = doc_id(d);
        let first = entry(&format!("{id}-e001"), &id, 1, "new", "person");
        couch
            .save(DB, &id, &document("person", json!({}), &[first]))
            .await;
    }
    let writes = |sequences: std::ops::RangeInclusive<u64>| {
        let couch = couch.clone();
        tokio::spawn(async move {
            for sequence in sequences {
                for d in 0..DOCS {
                    append_entry(&couch, &doc_id(d), sequence).await;
                }
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        })
    };
    // Entries published so far, and of them those outboxd marked.
    let published = || async {
        let (mut all, mut by_outboxd) = (0, 0);
        for d in 0..DOCS {
            let doc = couch.get(DB, &doc_id(d)).await.unwrap();
            for e in doc["extensions"]["_server_outbox"].as_array().unwrap() {
                if e["status"] == "published" {
                    all += 1;
                    by_outboxd += usize::from(e["published_at"] != PUBLISHER_MARK);
                }
            }
        }
        (all, by_outboxd)
    };
    let wait_published = |total: usize| async move {
        let start = std::time::Instant::now();
        loop {
            let (all, by_outboxd) = published().await;
            if all == total {
                return by_outboxd;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{all} of {total} published"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };

    // Its publisher alone, then outboxd beside it, SIGKILLed three times.
    let writer = writes(2..=BEFORE);
    let stop_first = Arc::new(AtomicBool::new(false));
    let first = tokio::spawn(document_service_publisher(
        couch.url.clone(),
        exchange.clone(),
        stop_first.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut child = ChildDaemon::spawn(&config);
    child.wait_healthy(WAIT).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        child.kill();
        child = ChildDaemon::spawn(&config);
        child.wait_healthy(WAIT).await;
    }
    // The switch: the service's publisher off; outboxd alone publishes and
    // marks what the service writes now.
    stop_first.store(true, Ordering::Relaxed);
    first.await.unwrap();
    writer.await.unwrap();
    writes(BEFORE + 1..=ALONE).await.unwrap();
    let by_outboxd = wait_published(DOCS * ALONE as usize).await;
    assert!(
        by_outboxd >= DOCS * (ALONE - BEFORE) as usize,
        "outboxd marked {by_outboxd} entries"
    );

    // Handing back: the service writes more, outboxd is killed mid-flight,
    // the service's publisher on.
    let writer = writes(ALONE + 1..=ENTRIES);
    tokio::time::sleep(Duration::from_millis(600)).await;
    child.kill();
    let stop_second = Arc::new(AtomicBool::new(false));
    let second = tokio::spawn(document_service_publisher(
        couch.url.clone(),
        exchange.clone(),
        stop_second.clone(),
    ));
    writer.await.unwrap();
    let total = DOCS * ENTRIES as usize;
    wait_published(total).await;
    stop_second.store(true, Ordering::Relaxed);
    second.await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Every entry consumed; per document the first arrivals in order.
    let mut first_seen: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    let mut ids = std::collections::BTreeSet::new();
    for got in queue.seen() {
        let id = got.message_id.clone().expect("a message id");
        if ids.insert(id.clone()) {
            let (doc, seq) = id.rsplit_once("-e").unwrap();
            first_seen
                .entry(doc.to_string())
                .or_default()
                .push(seq.parse().unwrap());
        }
    }
    assert_eq!(ids.len(), total, "entries consumed");
    for (doc, seqs) in &first_seen {
        assert_eq!(
            seqs,
            &(1..=ENTRIES).collect::<Vec<_>>(),
            "first arrivals of {doc}"
        );
    }
    // One revision per write and one per mark: nothing marked twice.
    for d in 0..DOCS {
        let doc = couch.get(DB, &doc_id(d)).await.unwrap();
        let rev = doc["_rev"].as_str().unwrap();
        assert!(
            rev.starts_with(&format!("{}-", 2 * ENTRIES)),
            "{}: {rev}",
            doc_id(d)
        );
        for e in doc["extensions"]["_server_outbox"].as_array().unwrap() {
            assert_eq!(e["status"], "published", "{e}");
            assert!(e["published_at"].is_string(), "{e}");
        }
    }
    queue.delete().await;
    delete_exchange(&exchange).await;
}
