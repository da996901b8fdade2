//! Requests/s POSTed to a receiver: through the `webhook` plugin
//! (WebAssembly guest → `wasi:http` → the host's pooled keep-alive client)
//! against a native pooled client (hyper-util's, keep-alive, as the host's)
//! sending the same signed requests with the same number in flight, in the
//! same run, alternating rounds (the machine's speed drifts,
//! docs/measurements.md), with the ratio.
//!
//! The plugin side calls `Plugin::deliver` directly with batches of
//! `--batch` events (fresh instance, `init`, `deliver`, as the delivery loop
//! does), without the store, so the figure is the sink's own cost over HTTP.
//! Every event of a batch is on its own stream, so up to `--in-flight`
//! requests run at once on both sides (the plugin's `max-concurrency`),
//! batch after batch.
//!
//! `--sink awareness` does the same with the `awareness` sink: its
//! `POST /ingest` (the shared mapping's JSON body, `x-ingest-secret`)
//! against a native client sending the same body, built with serde_json,
//! and the same headers.
//!
//! `--only plugin` (or `native`) runs one side alone, for a profiler
//! (`perf record`) to see that side's time only; no ratio is printed then.
//!
//! ```sh
//! scripts/build-plugins.sh
//! cargo run --release -p outboxd-bench --example bench_http -- receive --listen 127.0.0.1:18090 &
//! cargo run --release -p outboxd-bench --example webhook_bench -- --url http://127.0.0.1:18090 [--events 20000] [--rounds 3] [--batch 100] [--in-flight 32] [--sink webhook|awareness]
//! ```
//!
//! Prints one line per round and, last, one JSON object: requests/s of
//! each side (medians over the rounds) and `plugin / native`.

use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::stream::{self, StreamExt};
use hmac::Mac as _;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use outboxd::plugin;
use outboxd::plugin::bindings::{Event, Outcome};
use serde_json::json;

#[path = "common/mod.rs"]
mod common;

/// Payload bytes per event (docs/measurements.md measures with 256).
const PAYLOAD: usize = 256;
/// The signing secret both sides use (Standard Webhooks form).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

struct Args {
    url: String,
    events: usize,
    rounds: usize,
    batch: usize,
    in_flight: usize,
    /// Run only this side (`plugin` or `native`); both when `None`.
    only: Option<String>,
    /// `webhook` or `awareness`.
    sink: String,
}

fn args() -> Args {
    let mut a = Args {
        url: String::new(),
        events: 20_000,
        rounds: 3,
        batch: 100,
        in_flight: 32,
        only: None,
        sink: "webhook".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let number = || -> usize {
            value
                .parse()
                .unwrap_or_else(|_| panic!("{flag} needs a number"))
        };
        match flag.as_str() {
            "--url" => a.url = value.trim_end_matches('/').to_string(),
            "--events" => a.events = number(),
            "--rounds" => a.rounds = number(),
            "--batch" => a.batch = number(),
            "--in-flight" => a.in_flight = number(),
            "--only" if value == "plugin" || value == "native" => a.only = Some(value),
            "--only" => panic!("--only takes plugin or native"),
            "--sink" if value == "webhook" || value == "awareness" => a.sink = value,
            "--sink" => panic!("--sink takes webhook or awareness"),
            other => panic!(
                "unknown flag {other} (known: --url, --events, --rounds, --batch, --in-flight, --only, --sink)"
            ),
        }
    }
    assert!(
        !a.url.is_empty(),
        "--url names the receiver (bench_http receive)"
    );
    a
}

/// The awareness sink's ingest secret on both sides.
const INGEST_SECRET: &str = "bench ingest secret";

fn load_plugin(sink: &str, url: &str, in_flight: usize) -> anyhow::Result<plugin::Plugin> {
    if sink == "awareness" {
        let manifest = format!(
            "name = \"awareness\"\nversion = \"0.1.0\"\ncomponent = \"awareness.wasm\"\nwit = \"outboxd:sink@0.1.2\"\n\
             [limits]\ndeadline = \"30s\"\nmax-batch = 1000\n\
             [capabilities]\nhttp = [{url:?}]\n\
             [config]\nurl = \"{url}\"\nsecret = {INGEST_SECRET:?}\nmax-concurrency = \"{in_flight}\"\n"
        );
        return common::load_plugin("awareness", &manifest);
    }
    let manifest = format!(
        "name = \"webhook\"\nversion = \"0.1.0\"\ncomponent = \"webhook.wasm\"\nwit = \"outboxd:sink@0.1.0\"\n\
         [limits]\ndeadline = \"30s\"\nmax-batch = 1000\n\
         [capabilities]\nhttp = [{url:?}]\n\
         [config]\nurl = \"{url}/webhook\"\nsecret = {SECRET:?}\nmax-concurrency = \"{in_flight}\"\n"
    );
    common::load_plugin("webhook", &manifest)
}

fn event(round: usize, i: usize) -> Event {
    let head = format!("{{\"k\":{i},\"pad\":\"\"}}");
    let data = format!(
        "{{\"k\":{i},\"pad\":\"{}\"}}",
        "x".repeat(PAYLOAD - head.len())
    );
    Event {
        id: format!("whbench-{round}-{i}"),
        source: "https://bench.outboxd.invalid/webhook".into(),
        type_: "bench.event".into(),
        subject: None,
        stream: format!("s{i}"),
        sequence: round as u64 + 1,
        time: "2026-11-30T01:02:03.456Z".into(),
        datacontenttype: Some("application/json".into()),
        dataschema: None,
        data: data.into_bytes(),
        // What the awareness mapping reads (the webhook sink sends them as
        // `ce-` headers only when asked; it is not, here).
        extensions: vec![
            ("schemaid".into(), "bench-schema".into()),
            ("w3id".into(), "@bench".into()),
            ("operation".into(), "update".into()),
        ],
        attempt: 1,
        ingested_at: "2026-11-30T01:02:03.456789Z".into(),
    }
}

async fn through_plugin(
    plugin: &plugin::Plugin,
    events: &[Event],
    batch: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    for chunk in events.chunks(batch) {
        let outcomes = plugin
            .deliver(chunk)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if let Some(bad) = outcomes.iter().find(|o| !matches!(o, Outcome::Delivered)) {
            anyhow::bail!("plugin did not deliver: {bad:?}");
        }
    }
    Ok(started.elapsed())
}

type Native = Client<hyper_util::client::legacy::connect::HttpConnector, Full<bytes::Bytes>>;

/// The awareness sink's request for `e`, built natively: the same JSON
/// fields in the same order, and the same headers.
fn awareness_request(url: &str, e: &Event) -> anyhow::Result<http::Request<Full<bytes::Bytes>>> {
    let data: serde_json::Value = serde_json::from_slice(&e.data)?;
    let ext = |name: &str| {
        e.extensions
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let body = serde_json::to_vec(&json!({
        "eventId": e.id, "id": e.stream, "w3id": ext("w3id"), "evaultPublicKey": null,
        "data": data, "schemaId": ext("schemaid"), "operation": ext("operation"),
        "requestingPlatform": null, "occurredAt": e.time, "streamVersion": e.sequence,
    }))?;
    Ok(http::Request::post(format!("{url}/ingest"))
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .header("user-agent", "outboxd-bench-native")
        .header("x-ingest-secret", INGEST_SECRET)
        .body(Full::new(bytes::Bytes::from(body)))?)
}

/// The same requests (CloudEvents binary headers, Standard Webhooks
/// signature made per request) from a native pooled client, `in_flight` at
/// a time, batch after batch.
async fn native(
    sink: &str,
    client: &Native,
    url: &str,
    events: &[Event],
    batch: usize,
    in_flight: usize,
) -> anyhow::Result<Duration> {
    let key =
        base64::engine::general_purpose::STANDARD.decode(SECRET.trim_start_matches("whsec_"))?;
    let started = Instant::now();
    for chunk in events.chunks(batch) {
        let sends = chunk.iter().map(|e| {
            let key = key.clone();
            async move {
                if sink == "awareness" {
                    let response = client.request(awareness_request(url, e)?).await?;
                    let status = response.status();
                    response.into_body().collect().await?;
                    anyhow::ensure!(status.is_success(), "receiver answered {status}");
                    return anyhow::Ok(());
                }
                let timestamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_secs();
                let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key)?;
                mac.update(format!("{}.{timestamp}.", e.id).as_bytes());
                mac.update(&e.data);
                let signature = format!(
                    "v1,{}",
                    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
                );
                let request = http::Request::post(format!("{url}/webhook"))
                    .header("ce-specversion", "1.0")
                    .header("ce-id", &e.id)
                    .header("ce-source", &e.source)
                    .header("ce-type", &e.type_)
                    .header("ce-time", &e.time)
                    .header("ce-partitionkey", &e.stream)
                    .header("ce-sequence", e.sequence.to_string())
                    .header("content-type", "application/json")
                    .header("user-agent", "outboxd-bench-native")
                    .header("webhook-id", &e.id)
                    .header("webhook-timestamp", timestamp.to_string())
                    .header("webhook-signature", signature)
                    .body(Full::new(bytes::Bytes::from(e.data.clone())))?;
                let response = client.request(request).await?;
                let status = response.status();
                response.into_body().collect().await?;
                anyhow::ensure!(status.is_success(), "receiver answered {status}");
                anyhow::Ok(())
            }
        });
        let mut answers = stream::iter(sends).buffer_unordered(in_flight);
        while let Some(answer) = answers.next().await {
            answer?;
        }
    }
    Ok(started.elapsed())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let plugin = load_plugin(&args.sink, &args.url, args.in_flight)?;
    let client: Native = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http();
    eprintln!(
        "{} requests per side per round, {} rounds, batches of {}, {} in flight, {PAYLOAD}-byte bodies",
        args.events, args.rounds, args.batch, args.in_flight
    );
    // Warm up both sides (connections, compiled code), uncounted.
    let warm: Vec<Event> = (0..args.batch).map(|i| event(0, i)).collect();
    through_plugin(&plugin, &warm, args.batch).await?;
    native(
        &args.sink,
        &client,
        &args.url,
        &warm,
        args.batch,
        args.in_flight,
    )
    .await?;
    let (mut plugin_rps, mut native_rps) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        let events: Vec<Event> = (0..args.events).map(|i| event(round, i)).collect();
        // Alternate which side goes first.
        for side in [round % 2, (round + 1) % 2] {
            let name = if side == 0 { "plugin" } else { "native" };
            if args.only.as_deref().is_some_and(|only| only != name) {
                continue;
            }
            if side == 0 {
                let t = through_plugin(&plugin, &events, args.batch).await?;
                plugin_rps.push(args.events as f64 / t.as_secs_f64());
            } else {
                let t = native(
                    &args.sink,
                    &client,
                    &args.url,
                    &events,
                    args.batch,
                    args.in_flight,
                )
                .await?;
                native_rps.push(args.events as f64 / t.as_secs_f64());
            }
        }
        eprintln!(
            "round {round}: native {:.0} req/s, plugin {:.0} req/s",
            native_rps.last().copied().unwrap_or(f64::NAN),
            plugin_rps.last().copied().unwrap_or(f64::NAN)
        );
    }
    if args.only.is_some() {
        let rps = if plugin_rps.is_empty() {
            native_rps
        } else {
            plugin_rps
        };
        println!("{}", json!({ "side": args.only, "rps": median(rps) }));
        return Ok(());
    }
    let (p, n) = (median(plugin_rps), median(native_rps));
    println!(
        "{}",
        json!({
            "sink": args.sink, "requests": args.events, "rounds": args.rounds, "batch": args.batch,
            "in_flight": args.in_flight, "plugin_rps": p, "native_rps": n, "ratio": p / n,
        })
    );
    Ok(())
}
