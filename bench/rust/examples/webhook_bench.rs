//! Requests/s POSTed to a receiver: through the `webhook` plugin
//! (WebAssembly guest → `http-batch` → the host's pooled keep-alive client)
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
//! `--batches-in-flight N` (default 1) runs N batches at once on both
//! sides, each a task with `--in-flight / N` requests in flight, as
//! `delivery.batches-in-flight` runs a destination's turns; the calling
//! thread then only waits, and only the process CPU is the side's.
//!
//! `--only plugin` (or `native`) runs one side alone, for a profiler
//! (`perf record`) to see that side's time only; no ratio is printed then.
//!
//! ```sh
//! scripts/build-plugins.sh
//! cargo run --release -p outboxd-bench --example bench_http -- receive --listen 127.0.0.1:18090 &
//! cargo run --release -p outboxd-bench --example webhook_bench -- --url http://127.0.0.1:18090 [--events 20000] [--rounds 3] [--batch 100] [--in-flight 32] [--batches-in-flight 1] [--sink webhook|awareness]
//! ```
//!
//! Prints one line per round and, last, one JSON object: requests/s of
//! each side (medians over the rounds) and `plugin / native`, and the CPU
//! each side spent per request (medians, µs): on the calling thread (the
//! one that runs `Plugin::deliver`, or the native side's request futures)
//! and in the whole process (the calling thread and the runtime's
//! workers; the receiver is a process of its own). The throughput of two
//! sides sharing 2 cores with the receiver swings by a quarter between
//! rounds; CPU per request swings too, by about a tenth, so an A/B of a
//! change reads it over many alternating runs, or counts instructions
//! (bench/results/2026-12-05-outbound-host-copies.md).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{self, StreamExt};
use hmac::Mac as _;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use outboxd::plugin;
use outboxd::plugin::bindings::Event;
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
    /// Batches at once (`--batches-in-flight`), each with `in_flight /
    /// lanes` requests in flight, on both sides.
    lanes: usize,
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
        lanes: 1,
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
            "--batches-in-flight" => a.lanes = number(),
            "--only" if value == "plugin" || value == "native" => a.only = Some(value),
            "--only" => panic!("--only takes plugin or native"),
            "--sink" if value == "webhook" || value == "awareness" => a.sink = value,
            "--sink" => panic!("--sink takes webhook or awareness"),
            other => panic!(
                "unknown flag {other} (known: --url, --events, --rounds, --batch, --in-flight, --batches-in-flight, --only, --sink)"
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
        // What the awareness mapping reads; the webhook sink sends each as
        // a `ce-` header (CloudEvents HTTP binding §3.1.3.1), and so does
        // the native side.
        extensions: vec![
            ("schemaid".into(), "bench-schema".into()),
            ("w3id".into(), "@bench".into()),
            ("operation".into(), "update".into()),
        ],
        attempt: 1,
        ingested_at: "2026-11-30T01:02:03.456789Z".into(),
    }
}

/// Sends the batch of the events in a range, one side's way.
type Send = Arc<
    dyn Fn(Arc<Vec<Event>>, std::ops::Range<usize>) -> BoxFuture<'static, anyhow::Result<()>>
        + std::marker::Send
        + Sync,
>;

/// Send `events` in batches of `batch` through `send`, `lanes` batches at
/// once, as the delivery loop runs `delivery.batches-in-flight` turns of a
/// destination (each a task of its own, the next batch taken as one
/// finishes). One lane runs on the calling task, so the calling thread's
/// CPU is that lane's. Returns the time all took.
async fn in_lanes(
    events: &Arc<Vec<Event>>,
    batch: usize,
    lanes: usize,
    send: Send,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let lane = move |events: Arc<Vec<Event>>, next: Arc<AtomicUsize>, send: Send| async move {
        loop {
            let start = next.fetch_add(1, Ordering::Relaxed) * batch;
            if start >= events.len() {
                return anyhow::Ok(());
            }
            send(events.clone(), start..(start + batch).min(events.len())).await?;
        }
    };
    if lanes <= 1 {
        lane(events.clone(), next, send).await?;
    } else {
        let mut running = tokio::task::JoinSet::new();
        for _ in 0..lanes {
            running.spawn(lane(events.clone(), next.clone(), send.clone()));
        }
        while let Some(done) = running.join_next().await {
            done??;
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

/// The same requests as the plugin sends for `chunk` (CloudEvents binary
/// headers, the event's extensions among them, Standard Webhooks
/// signature made per request), from a native pooled client, `in_flight`
/// at a time. Only `user-agent` differs, by a byte.
async fn native_batch(
    sink: &str,
    client: &Native,
    url: &str,
    chunk: &[Event],
    in_flight: usize,
) -> anyhow::Result<()> {
    let key =
        base64::engine::general_purpose::STANDARD.decode(SECRET.trim_start_matches("whsec_"))?;
    {
        // Boxed and collected first: the chunk then borrows into futures
        // that are `Send` for every lifetime, so a lane can be a task.
        let sends: Vec<BoxFuture<'_, anyhow::Result<()>>> = chunk
            .iter()
            .map(|e| {
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
                        base64::engine::general_purpose::STANDARD
                            .encode(mac.finalize().into_bytes())
                    );
                    let mut request = http::Request::post(format!("{url}/webhook"))
                        .header("ce-specversion", "1.0")
                        .header("ce-id", &e.id)
                        .header("ce-source", &e.source)
                        .header("ce-type", &e.type_)
                        .header("ce-time", &e.time)
                        .header("ce-partitionkey", &e.stream)
                        .header("ce-sequence", e.sequence.to_string());
                    for (name, value) in &e.extensions {
                        request = request.header(format!("ce-{name}"), value);
                    }
                    let request = request
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
                .boxed()
            })
            .collect();
        let mut answers = stream::iter(sends).buffer_unordered(in_flight);
        while let Some(answer) = answers.next().await {
            answer?;
        }
    }
    Ok(())
}

/// CPU time used so far: by the calling thread, and by the whole process.
fn cpu() -> (Duration, Duration) {
    let clock = |id| {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid, writable timespec; both clock ids exist
        // on Linux since 2.6.12.
        let rc = unsafe { libc::clock_gettime(id, &mut t) };
        assert_eq!(rc, 0, "clock_gettime failed");
        Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    };
    (
        clock(libc::CLOCK_THREAD_CPUTIME_ID),
        clock(libc::CLOCK_PROCESS_CPUTIME_ID),
    )
}

/// CPU per request, µs, between two [`cpu`] readings: (calling thread,
/// process).
fn per_request(before: (Duration, Duration), after: (Duration, Duration), n: usize) -> (f64, f64) {
    let us = |a: Duration, b: Duration| (b - a).as_secs_f64() * 1e6 / n as f64;
    (us(before.0, after.0), us(before.1, after.1))
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
    let client: Native = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http();
    eprintln!(
        "{} requests per side per round, {} rounds, batches of {}, {} batches at once, {} in flight, {PAYLOAD}-byte bodies",
        args.events, args.rounds, args.batch, args.lanes, args.in_flight
    );
    let lanes = args.lanes.max(1);
    let per_lane = (args.in_flight / lanes).max(1);
    let plugin = load_plugin(&args.sink, &args.url, per_lane)?;
    let through_plugin = |plugin: plugin::Plugin| -> Send {
        Arc::new(
            move |events: Arc<Vec<Event>>, range: std::ops::Range<usize>| {
                let plugin = plugin.clone();
                async move { common::deliver_all(&plugin, &events[range]).await }.boxed()
            },
        )
    };
    let native = |client: Native, url: String, sink: String| -> Send {
        Arc::new(
            move |events: Arc<Vec<Event>>, range: std::ops::Range<usize>| {
                let (client, url, sink) = (client.clone(), url.clone(), sink.clone());
                async move { native_batch(&sink, &client, &url, &events[range], per_lane).await }
                    .boxed()
            },
        )
    };
    // Warm up both sides (connections, compiled code), uncounted.
    let warm: Arc<Vec<Event>> = Arc::new((0..args.batch * lanes).map(|i| event(0, i)).collect());
    in_lanes(&warm, args.batch, lanes, through_plugin(plugin.clone())).await?;
    in_lanes(
        &warm,
        args.batch,
        lanes,
        native(client.clone(), args.url.clone(), args.sink.clone()),
    )
    .await?;
    let (mut plugin_rps, mut native_rps) = (Vec::new(), Vec::new());
    // CPU per request of each side, µs: (calling thread, process).
    let (mut plugin_cpu, mut native_cpu) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        let events: Arc<Vec<Event>> = Arc::new((0..args.events).map(|i| event(round, i)).collect());
        // Alternate which side goes first.
        for side in [round % 2, (round + 1) % 2] {
            let name = if side == 0 { "plugin" } else { "native" };
            if args.only.as_deref().is_some_and(|only| only != name) {
                continue;
            }
            let before = cpu();
            if side == 0 {
                let t =
                    in_lanes(&events, args.batch, lanes, through_plugin(plugin.clone())).await?;
                plugin_rps.push(args.events as f64 / t.as_secs_f64());
                plugin_cpu.push(per_request(before, cpu(), args.events));
            } else {
                let send = native(client.clone(), args.url.clone(), args.sink.clone());
                let t = in_lanes(&events, args.batch, lanes, send).await?;
                native_rps.push(args.events as f64 / t.as_secs_f64());
                native_cpu.push(per_request(before, cpu(), args.events));
            }
        }
        let last = |v: &[(f64, f64)]| v.last().copied().unwrap_or((f64::NAN, f64::NAN));
        let (pc, nc) = (last(&plugin_cpu), last(&native_cpu));
        eprintln!(
            "round {round}: native {:.0} req/s ({:.1} µs calling thread, {:.1} µs process), \
             plugin {:.0} req/s ({:.1} µs, {:.1} µs)",
            native_rps.last().copied().unwrap_or(f64::NAN),
            nc.0,
            nc.1,
            plugin_rps.last().copied().unwrap_or(f64::NAN),
            pc.0,
            pc.1,
        );
    }
    let thread = |v: &[(f64, f64)]| median(v.iter().map(|c| c.0).collect());
    let process = |v: &[(f64, f64)]| median(v.iter().map(|c| c.1).collect());
    if args.only.is_some() {
        let (rps, cpu) = if plugin_rps.is_empty() {
            (native_rps, native_cpu)
        } else {
            (plugin_rps, plugin_cpu)
        };
        println!(
            "{}",
            json!({
                "side": args.only, "rps": median(rps),
                "cpu_us_thread": thread(&cpu), "cpu_us_process": process(&cpu),
            })
        );
        return Ok(());
    }
    let (p, n) = (median(plugin_rps), median(native_rps));
    println!(
        "{}",
        json!({
            "sink": args.sink, "requests": args.events, "rounds": args.rounds, "batch": args.batch,
            "in_flight": args.in_flight, "batches_in_flight": lanes, "plugin_rps": p, "native_rps": n, "ratio": p / n,
            "plugin_cpu_us_thread": thread(&plugin_cpu), "plugin_cpu_us_process": process(&plugin_cpu),
            "native_cpu_us_thread": thread(&native_cpu), "native_cpu_us_process": process(&native_cpu),
        })
    );
    Ok(())
}
