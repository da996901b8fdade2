//! Destinations at scale, on PostgreSQL: end-to-end deliveries per second
//! with one destination and with many, and what idle destinations cost the
//! busy ones — all in one run, against the same receiver.
//!
//! An outboxd daemon runs in this process with the shipped webhook plugin
//! (built by `scripts/build-plugins.sh` into `target/plugins`) against a
//! fresh database; destinations are created through the admin API, all
//! posting to one loopback receiver that answers 200 at once. Stages, each
//! on a fresh database:
//!
//! 1. **one**: 1 destination, `--events` events → deliveries/s;
//! 2. **fan-out**: `--destinations` destinations all matching,
//!    `--fanout-events` events → deliveries/s (events × destinations);
//! 3. **busy alone**: 10 destinations, `--events` events fanned to all;
//! 4. **busy beside idle**: the same 10 beside `--destinations − 10`
//!    destinations whose filter matches none of the events — the cost of
//!    idle destinations on the busy ones is the ratio of 4 to 3 (aim: at
//!    least 0.5, "within 2×").
//!
//! ```sh
//! cargo run --release -p outboxd-bench --example destinations_bench -- [--events 5000] [--destinations 1000] [--fanout-events 100]
//! ```
//! `OUTBOXD_TEST_PG` names the admin URL (default the local server, trust).
//! Prints one JSON line per stage and a last line with the ratios.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxd::config::Config;
use outboxd::daemon::{Daemon, Migrations};
use serde_json::{json, Value};
use sqlx::Connection;

struct Args {
    events: usize,
    destinations: usize,
    fanout_events: usize,
    plugins: PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        events: 5_000,
        destinations: 1_000,
        fanout_events: 100,
        plugins: PathBuf::from("target/plugins"),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        match pair[0].as_str() {
            "--events" => a.events = value.parse().expect("--events N"),
            "--destinations" => a.destinations = value.parse().expect("--destinations N"),
            "--fanout-events" => a.fanout_events = value.parse().expect("--fanout-events N"),
            "--plugins" => a.plugins = PathBuf::from(value),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn admin_url() -> String {
    std::env::var("OUTBOXD_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A receiver that counts requests and answers 200.
async fn receiver() -> (String, Arc<AtomicU64>) {
    let count = Arc::new(AtomicU64::new(0));
    let counter = count.clone();
    let app = axum::Router::new().fallback(move || {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::Relaxed);
            "ok"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (origin, count)
}

struct Stage {
    daemon: Option<Daemon>,
    base: String,
    db: String,
    http: reqwest::Client,
    _plugins: tempfile::TempDir,
}

impl Stage {
    async fn start(wasm: &Path, origin: &str) -> Stage {
        let name = format!(
            "outboxd_destbench_{}",
            hex::encode(rand::random::<[u8; 4]>())
        );
        let admin = admin_url();
        let mut c = sqlx::PgConnection::connect(&admin).await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut c)
            .await
            .unwrap();
        let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);
        let plugins = tempfile::tempdir().unwrap();
        std::fs::copy(wasm, plugins.path().join("webhook.wasm")).unwrap();
        std::fs::write(
            plugins.path().join("webhook.toml"),
            format!(
                "name = \"webhook\"\nversion = \"0.1.0\"\ncomponent = \"webhook.wasm\"\nwit = \"outboxd:sink@0.1.0\"\n\
                 [limits]\ndeadline = \"10s\"\nmax-batch = 100\n[capabilities]\nhttp = [\"{origin}\"]\n\
                 [config]\nurl = \"{origin}/manifest\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n"
            ),
        )
        .unwrap();
        let data = plugins.path().join("data");
        let config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data,
            database_url: Some(url),
            plugins_dir: plugins.path().to_path_buf(),
            // Destination secrets are sealed; PostgreSQL needs a key.
            secrets: outboxd::secrets::settings::SecretsConfig {
                key: Some("bench AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=".into()),
                ..Default::default()
            },
            ..Config::default()
        };
        let daemon = Daemon::start(config, Migrations::Apply).await.unwrap();
        let base = format!("http://{}", daemon.addr);
        Stage {
            daemon: Some(daemon),
            base,
            db: name,
            http: reqwest::Client::new(),
            _plugins: plugins,
        }
    }

    async fn create(&self, name: &str, url: &str, types: &[&str]) {
        let r = self
            .http
            .post(format!("{}/v1/admin/destinations", self.base))
            .json(&json!({ "name": name, "sink": "webhook", "config": { "url": url }, "filter": { "types": types } }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
    }

    /// Post `n` events of type `ty`, `per_request` to a request.
    async fn post(&self, n: usize, ty: &str, per_request: usize) {
        for chunk in (0..n).collect::<Vec<_>>().chunks(per_request) {
            let batch: Vec<Value> = chunk
                .iter()
                .map(|i| {
                    json!({ "specversion": "1.0", "id": format!("{ty}-{i}"), "source": "/bench", "type": ty,
                            "partitionkey": format!("s{}", i % 100), "data": { "i": i } })
                })
                .collect();
            let r = self
                .http
                .post(format!("{}/v1/events", self.base))
                .header("content-type", "application/cloudevents-batch+json")
                .json(&batch)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            assert_eq!(status, 201, "{}", r.text().await.unwrap_or_default());
        }
    }

    async fn stop(mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown().await;
        }
        let mut c = sqlx::PgConnection::connect(&admin_url()).await.unwrap();
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.db))
            .execute(&mut c)
            .await;
    }
}

/// Deliveries one ingest request creates at most: an application fanning
/// out to 1,000 destinations sends smaller requests than one with one
/// destination, as 500 events × 1,000 destinations (500,000 rows in one
/// transaction) outlast the default 10 s `delivery.db-timeout` here.
const DELIVERIES_PER_REQUEST: usize = 20_000;

/// Post `events` of type `ty`, wait for `expected` requests at the
/// receiver; deliveries per second from the first post.
async fn run(stage: &Stage, count: &AtomicU64, events: usize, ty: &str, expected: u64) -> f64 {
    let before = count.load(Ordering::Relaxed);
    let started = Instant::now();
    let fanout = (expected as usize / events.max(1)).max(1);
    let per_request = (DELIVERIES_PER_REQUEST / fanout).clamp(1, 500);
    stage.post(events, ty, per_request).await;
    while count.load(Ordering::Relaxed) - before < expected {
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "only {} of {expected} deliveries",
            count.load(Ordering::Relaxed) - before
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    expected as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let a = args();
    let wasm = a.plugins.join("webhook.wasm");
    assert!(
        wasm.exists(),
        "{} missing: run scripts/build-plugins.sh",
        wasm.display()
    );
    let (origin, count) = receiver().await;
    let busy = 10.min(a.destinations);

    let s = Stage::start(&wasm, &origin).await;
    s.create("one", &format!("{origin}/one"), &[]).await;
    let one = run(&s, &count, a.events, "hot", a.events as u64).await;
    println!(
        "{}",
        json!({ "stage": "one", "destinations": 1, "events": a.events, "deliveries_per_s": one.round() })
    );
    s.stop().await;

    let s = Stage::start(&wasm, &origin).await;
    let t = Instant::now();
    for i in 0..a.destinations {
        s.create(&format!("d{i}"), &format!("{origin}/d{i}"), &[])
            .await;
    }
    let created_s = t.elapsed().as_secs_f64();
    let fanout = run(
        &s,
        &count,
        a.fanout_events,
        "hot",
        (a.fanout_events * a.destinations) as u64,
    )
    .await;
    println!(
        "{}",
        json!({ "stage": "fan-out", "destinations": a.destinations, "events": a.fanout_events,
        "deliveries_per_s": fanout.round(), "create_all_s": (created_s * 10.0).round() / 10.0 })
    );
    s.stop().await;

    let s = Stage::start(&wasm, &origin).await;
    for i in 0..busy {
        s.create(&format!("busy{i}"), &format!("{origin}/b{i}"), &["hot*"])
            .await;
    }
    let alone = run(&s, &count, a.events, "hot", (a.events * busy) as u64).await;
    println!(
        "{}",
        json!({ "stage": "busy alone", "destinations": busy, "events": a.events, "deliveries_per_s": alone.round() })
    );
    for i in busy..a.destinations {
        s.create(&format!("idle{i}"), &format!("{origin}/i{i}"), &["cold"])
            .await;
    }
    // Let every idle loop start and settle into its idle polling.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let beside = run(&s, &count, a.events, "hot2", (a.events * busy) as u64).await;
    println!(
        "{}",
        json!({ "stage": "busy beside idle", "destinations": a.destinations, "busy": busy,
        "events": a.events, "deliveries_per_s": beside.round() })
    );
    s.stop().await;

    println!(
        "{}",
        json!({
            "events": a.events, "destinations": a.destinations, "fanout_events": a.fanout_events, "busy": busy,
            "one_dps": one.round(), "fanout_dps": fanout.round(), "busy_alone_dps": alone.round(),
            "busy_beside_idle_dps": beside.round(), "create_all_s": (created_s * 10.0).round() / 10.0,
            "fanout_vs_one": (fanout / one * 100.0).round() / 100.0,
            "busy_beside_idle_vs_alone": (beside / alone * 100.0).round() / 100.0,
        })
    );
}
