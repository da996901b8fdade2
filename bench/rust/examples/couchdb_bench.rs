//! The document-store outbox, relayed + published + marked per second:
//! outboxd (the `couchdb` source → store → `amqp` → `couchdb-mark`) against
//! a plain program doing the same three steps with the same libraries
//! (reqwest reads the pending view page by page, lapin publishes each page
//! with 100 confirms in flight, reqwest marks each document with GET + PUT,
//! one after the other as `couchdb-mark` does). Rounds alternate which side
//! goes first (the disk's fsync time drifts, docs/measurements.md); the ratio is
//! printed. Then the time from a document's save to its entry marked
//! published, p50/p99, with documents saved at a steady pace while outboxd
//! runs.
//!
//! ```sh
//! scripts/build-plugins.sh && npm ci --prefix tests/couchdb
//! cargo run --release -p outboxd-bench --example couchdb_bench -- [--docs 10000] [--rounds 2] [--latency-docs 500]
//! ```
//!
//! Needs RabbitMQ on 127.0.0.1:5672 and Node (it starts pouchdb-server from
//! tests/couchdb on a free port with a data folder of its own). The last
//! line on stdout is one JSON object with the medians' means, the ratio and
//! the latency percentiles (read by bench/sources.py).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
use outboxd::config::Config;
use outboxd::daemon::{Daemon, Migrations};
use serde_json::{json, Value};

/// Confirms in flight in the plain program.
const IN_FLIGHT: usize = 100;
/// View rows per page, both sides.
const PAGE: usize = 200;

struct Args {
    docs: usize,
    rounds: usize,
    latency_docs: usize,
}

fn args() -> Args {
    let mut a = Args {
        docs: 10_000,
        rounds: 2,
        latency_docs: 500,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value: usize = it
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{flag} needs a number"));
        match flag.as_str() {
            "--docs" => a.docs = value,
            "--rounds" => a.rounds = value,
            "--latency-docs" => a.latency_docs = value,
            other => panic!("unknown flag {other} (known: --docs, --rounds, --latency-docs)"),
        }
    }
    a
}

fn repo() -> PathBuf {
    // This crate is bench/rust/.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

fn rfc3339_ms(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).unwrap();
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// A document with one pending entry.
fn doc(id: &str, created_ms: i64) -> Value {
    json!({
        "_id": id,
        "type": "person",
        "extensions": {
            "_server_outbox": [{
                "event_id": format!("evt-{id}"), "mutation_id": format!("m-{id}"),
                "content_hash": "h", "document_id": id, "sequence": 1, "operation": "new",
                "routing_key": "documents.new.person", "status": "pending",
                "created_at": rfc3339_ms(created_ms), "published_at": null,
                "payload": { "document_id": id, "name": "x".repeat(200) },
            }],
            "_server_mutations": { format!("m-{id}"): "h" },
        }
    })
}

struct Couch {
    url: String,
    http: reqwest::Client,
}

impl Couch {
    async fn create(&self, db: &str) -> anyhow::Result<()> {
        let r = self.http.put(format!("{}/{db}", self.url)).send().await?;
        anyhow::ensure!(r.status().is_success(), "PUT /{db}: {}", r.status());
        Ok(())
    }

    /// `POST /{db}/_bulk_docs` in chunks (setup, not timed).
    async fn fill(&self, db: &str, n: usize) -> anyhow::Result<()> {
        let now = now_ms();
        let docs: Vec<Value> = (0..n).map(|i| doc(&format!("d{i:06}"), now)).collect();
        for chunk in docs.chunks(500) {
            let r = self
                .http
                .post(format!("{}/{db}/_bulk_docs", self.url))
                .json(&json!({ "docs": chunk }))
                .send()
                .await?;
            anyhow::ensure!(r.status().is_success(), "_bulk_docs: {}", r.status());
        }
        Ok(())
    }

    /// Rows of the pending view (`limit=0`: the total only).
    async fn pending(&self, db: &str) -> anyhow::Result<u64> {
        let v: Value = self
            .http
            .get(format!(
                "{}/{db}/_design/outboxd/_view/pending?limit=0",
                self.url
            ))
            .send()
            .await?
            .json()
            .await?;
        Ok(v["total_rows"].as_u64().unwrap_or(u64::MAX))
    }
}

/// The plain program: read the view, publish, mark. Returns entries/s.
async fn plain(
    couch: &Couch,
    db: &str,
    amqp: &str,
    exchange: &str,
    n: usize,
) -> anyhow::Result<f64> {
    // The same pending view the source installs (setup, not timed).
    let ddoc = json!({ "views": { "pending": { "map":
        "function (doc) { var e = doc.extensions && doc.extensions._server_outbox; if (!Array.isArray(e)) return; \
         for (var i = 0; i < e.length; i++) if (e[i] && e[i].status === 'pending') emit([doc._id, e[i].sequence], null); }" } } });
    couch
        .http
        .put(format!("{}/{db}/_design/outboxd", couch.url))
        .json(&ddoc)
        .send()
        .await?;
    let conn = Connection::connect(amqp, ConnectionProperties::default()).await?;
    let started = Instant::now();
    let mut done = 0;
    loop {
        // Marked entries leave the view: always read its first page.
        let page: Value = couch
            .http
            .get(format!("{}/{db}/_design/outboxd/_view/pending", couch.url))
            .query(&[("include_docs", "true"), ("limit", &PAGE.to_string())])
            .send()
            .await?
            .json()
            .await?;
        let rows = page["rows"].as_array().cloned().unwrap_or_default();
        if rows.is_empty() {
            break;
        }
        // A channel per page: cheap next to the page's marks, and a broker
        // that closes a channel (as RabbitMQ may) costs one page's retry.
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        for chunk in rows.chunks(IN_FLIGHT) {
            let mut confirms = Vec::new();
            for row in chunk {
                let e = &row["doc"]["extensions"]["_server_outbox"][0];
                let props = BasicProperties::default()
                    .with_message_id(e["event_id"].as_str().unwrap().into())
                    .with_delivery_mode(2);
                let body = serde_json::to_vec(&e["payload"])?;
                confirms.push(
                    ch.basic_publish(
                        exchange.into(),
                        e["routing_key"].as_str().unwrap().into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..Default::default()
                        },
                        &body,
                        props,
                    )
                    .await?,
                );
            }
            for c in confirms {
                anyhow::ensure!(c.await?.is_ack(), "nacked");
            }
        }
        let _ = ch.close(200, "page done".into()).await;
        for row in &rows {
            let id = row["id"].as_str().unwrap();
            let url = format!("{}/{db}/{id}", couch.url);
            let mut d: Value = couch.http.get(&url).send().await?.json().await?;
            d["extensions"]["_server_outbox"][0]["status"] = json!("published");
            d["extensions"]["_server_outbox"][0]["published_at"] = json!(rfc3339_ms(now_ms()));
            let r = couch.http.put(&url).json(&d).send().await?;
            anyhow::ensure!(r.status().is_success(), "PUT {id}: {}", r.status());
            done += 1;
        }
    }
    anyhow::ensure!(done == n, "plain marked {done} of {n}");
    let _ = conn.close(200, "done".into()).await;
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// A plugins folder with `amqp` and `couchdb-mark` for `db`.
fn plugins(dir: &Path, couch: &str, db: &str, amqp: &str, exchange: &str) -> anyhow::Result<()> {
    let built = repo().join("target/plugins");
    for name in ["amqp", "couchdb-mark"] {
        std::fs::copy(
            built.join(format!("{name}.wasm")),
            dir.join(format!("{name}.wasm")),
        )?;
    }
    let head = |name: &str| {
        format!("name = {name:?}\nversion = \"0.1.0\"\ncomponent = \"{name}.wasm\"\nwit = \"outboxd:sink@0.1.0\"\n")
    };
    std::fs::write(
        dir.join("amqp.toml"),
        format!(
            "{}[limits]\ndeadline = \"30s\"\nmax-batch = 100\n[capabilities]\namqp = {{ url = {amqp:?}, exchanges = [{exchange:?}] }}\n\
             [config]\nexchange = {exchange:?}\nrouting-key = \"{{routingkey}}\"\n",
            head("amqp")
        ),
    )?;
    std::fs::write(
        dir.join("couchdb-mark.toml"),
        format!(
            "{}after = \"amqp\"\n[limits]\ndeadline = \"30s\"\nmax-batch = 100\n[capabilities]\nhttp = [{couch:?}]\n\
             [config]\nurl = {couch:?}\ndatabase = {db:?}\n",
            head("couchdb-mark")
        ),
    )?;
    Ok(())
}

/// Compiled plugins, shared by every run (each run's `data-dir/cache`
/// links here), so no run pays for compiling them.
fn shared_cache() -> &'static Path {
    static CACHE: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

async fn start_daemon(
    couch: &Couch,
    db: &str,
    amqp: &str,
    exchange: &str,
) -> anyhow::Result<(Daemon, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    std::os::unix::fs::symlink(shared_cache(), dir.path().join("cache"))?;
    let plugins_dir = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins_dir)?;
    plugins(&plugins_dir, &couch.url, db, amqp, exchange)?;
    let mut config = Config {
        listen: "127.0.0.1:0".parse()?,
        data_dir: dir.path().to_path_buf(),
        plugins_dir,
        ..Config::default()
    };
    let source = json!({ "kind": "couchdb", "url": couch.url, "database": db,
                         "scan-interval": "1h", "feed-timeout": "1s", "request-timeout": "5s" });
    config
        .sources
        .insert("docs".into(), serde_json::from_value(source)?);
    let daemon = Daemon::start(config, Migrations::Apply).await?;
    Ok((daemon, dir))
}

/// outboxd over a filled database: entries/s from start to none pending.
async fn outboxd(
    couch: &Couch,
    db: &str,
    amqp: &str,
    exchange: &str,
    n: usize,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let (daemon, _dir) = start_daemon(couch, db, amqp, exchange).await?;
    loop {
        if couch.pending(db).await.unwrap_or(u64::MAX) == 0 {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(3600),
            "outboxd did not finish"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    daemon.shutdown().await;
    Ok(rate)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args();
    let amqp = std::env::var("OUTBOXD_BENCH_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let suffix = hex::encode(rand::random::<[u8; 4]>());
    let exchange = format!("outboxd-bench-{suffix}");
    let queue = format!("outboxd-bench-{suffix}");
    let conn = Connection::connect(&amqp, ConnectionProperties::default()).await?;
    let admin = conn.create_channel().await?;
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    admin
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await?;
    let q = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    admin
        .queue_declare(queue.as_str().into(), q, FieldTable::default())
        .await?;
    admin
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "documents.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;

    // pouchdb-server on a free port with its own data folder.
    let data = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut server = std::process::Command::new("node")
        .arg(repo().join("tests/couchdb/node_modules/pouchdb-server/bin/pouchdb-server"))
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--no-stdout-logs",
        ])
        .arg("--dir")
        .arg(data.path())
        .arg("--config")
        .arg(data.path().join("config.json"))
        .current_dir(data.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let couch = Couch {
        url: format!("http://127.0.0.1:{port}"),
        http: reqwest::Client::new(),
    };
    let up = Instant::now();
    while couch.http.get(&couch.url).send().await.is_err() {
        anyhow::ensure!(
            up.elapsed() < Duration::from_secs(60),
            "pouchdb-server did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Warm-up: compile the plugins into the shared cache.
    couch.create("bench_warmup").await?;
    let (daemon, _warm) = start_daemon(&couch, "bench_warmup", &amqp, &exchange).await?;
    daemon.shutdown().await;

    let n = args.docs;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        for side in if round % 2 == 0 {
            ["outboxd", "plain"]
        } else {
            ["plain", "outboxd"]
        } {
            let db = format!("bench_{round}_{side}");
            couch.create(&db).await?;
            couch.fill(&db, n).await?;
            let rate = if side == "outboxd" {
                outboxd(&couch, &db, &amqp, &exchange, n).await?
            } else {
                plain(&couch, &db, &amqp, &exchange, n).await?
            };
            println!("round {round} {side:>7}: {rate:8.1} entries/s (relayed, published, marked; {n} documents)");
            if side == "outboxd" {
                ours.push(rate)
            } else {
                base.push(rate)
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "outboxd {:.1}/s vs plain {:.1}/s: ratio {:.2} (aim: at least 0.8)",
        mean(&ours),
        mean(&base),
        mean(&ours) / mean(&base)
    );

    // Save → marked latency, documents saved at a steady pace.
    let db = "bench_latency";
    couch.create(db).await?;
    let (daemon, _dir) = start_daemon(&couch, db, &amqp, &exchange).await?;
    let pace = Duration::from_millis(20);
    let mut saved = Vec::new();
    for i in 0..args.latency_docs {
        let id = format!("l{i:06}");
        let t = now_ms();
        let r = couch
            .http
            .put(format!("{}/{db}/{id}", couch.url))
            .json(&doc(&id, t))
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "PUT {id}");
        saved.push((id, t));
        tokio::time::sleep(pace).await;
    }
    let waited = Instant::now();
    while couch.pending(db).await.unwrap_or(u64::MAX) > 0 {
        anyhow::ensure!(
            waited.elapsed() < Duration::from_secs(600),
            "latency run did not finish"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    daemon.shutdown().await;
    let mut latencies = Vec::new();
    for (id, t) in &saved {
        let d: Value = couch
            .http
            .get(format!("{}/{db}/{id}", couch.url))
            .send()
            .await?
            .json()
            .await?;
        let at = d["extensions"]["_server_outbox"][0]["published_at"]
            .as_str()
            .unwrap_or_default();
        let at = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)?;
        latencies.push((at.unix_timestamp_nanos() / 1_000_000) as i64 - t);
    }
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!(
        "save → marked published: p50 {} ms, p99 {} ms ({} documents, one every {pace:?})",
        pct(0.50),
        pct(0.99),
        latencies.len()
    );
    println!(
        "{}",
        json!({
            "stage": "couchdb",
            "docs": n,
            "rounds": args.rounds,
            "outboxd_entries_per_s": (mean(&ours) * 10.0).round() / 10.0,
            "plain_entries_per_s": (mean(&base) * 10.0).round() / 10.0,
            "ratio": (mean(&ours) / mean(&base) * 100.0).round() / 100.0,
            "latency_docs": latencies.len(),
            "save_to_marked_p50_ms": pct(0.50),
            "save_to_marked_p99_ms": pct(0.99),
        })
    );

    let _ = server.kill();
    let _ = server.wait();
    let _ = admin
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = admin
        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await;
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}
