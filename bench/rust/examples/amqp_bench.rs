//! Events/s published to RabbitMQ with confirms: through the `amqp` plugin
//! (WebAssembly guest → `outboxd:sink/amqp` → the host's lapin connection)
//! against a plain lapin program keeping 100 confirms in flight, in the same
//! run, alternating rounds (the disk's fsync time drifts, docs/measurements.md), with
//! the ratio.
//!
//! The plugin side calls `Plugin::deliver` directly with batches of
//! `--batch` events (fresh instance, `init`, `deliver`, as the delivery loop
//! does), without the store, so the figure is the plugin's cost over lapin.
//! Every event of a batch is on its own stream, so the default strict
//! ordering makes one `publish-batch` call per batch.
//!
//! ```sh
//! scripts/build-plugins.sh
//! cargo run --release -p outboxd-bench --example amqp_bench -- [--events 5000] [--rounds 5] [--batch 100]
//! ```
//!
//! Needs RabbitMQ on 127.0.0.1:5672 (`OUTBOXD_BENCH_AMQP` for another URL).
//! Declares a durable topic exchange and a durable queue of its own, so
//! confirms wait for the disk as in production, and deletes them at the end.

use std::time::{Duration, Instant};

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};
use outboxd::plugin;
use outboxd::plugin::bindings::Event;

#[path = "common/mod.rs"]
mod common;

/// Payload bytes per event (docs/measurements.md measures with 256).
const PAYLOAD: usize = 256;
/// Confirms in flight in the plain lapin program.
const IN_FLIGHT: usize = 100;

struct Args {
    events: usize,
    rounds: usize,
    batch: usize,
}

fn args() -> Args {
    let mut a = Args {
        events: 5000,
        rounds: 5,
        batch: 100,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value: usize = it
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{flag} needs a number"));
        match flag.as_str() {
            "--events" => a.events = value,
            "--rounds" => a.rounds = value,
            "--batch" => a.batch = value,
            other => panic!("unknown flag {other} (known: --events, --rounds, --batch)"),
        }
    }
    a
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args();
    let url = std::env::var("OUTBOXD_BENCH_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let suffix = hex::encode(rand::random::<[u8; 4]>());
    let exchange = format!("outboxd-bench-{suffix}");
    let queue = format!("outboxd-bench-{suffix}");

    let conn = Connection::connect(&url, ConnectionProperties::default()).await?;
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
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let publisher = conn.create_channel().await?;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await?;

    let plugin = load_plugin(&url, &exchange)?;

    println!(
        "{} events per side per round, {} rounds, plugin batches of {}, lapin with {IN_FLIGHT} confirms in flight, {PAYLOAD}-byte payloads",
        args.events, args.rounds, args.batch
    );
    // Warm up both sides (connection, channel, compiled code), uncounted.
    plain_lapin(&publisher, &exchange, args.batch, 0).await?;
    through_plugin(&plugin, args.batch, args.batch, 0).await?;
    println!(
        "{:>5} {:>14} {:>14} {:>7}",
        "round", "lapin ev/s", "plugin ev/s", "ratio"
    );
    let (mut lapin_total, mut plugin_total) = (Duration::ZERO, Duration::ZERO);
    let mut ratios = Vec::new();
    for round in 1..=args.rounds {
        // Alternate which side goes first, so neither always follows the
        // other's purge.
        let mut native = Duration::ZERO;
        let mut through = Duration::ZERO;
        for side in [round % 2, (round + 1) % 2] {
            admin
                .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                .await?;
            if side == 1 {
                native = plain_lapin(&publisher, &exchange, args.events, round).await?;
            } else {
                through = through_plugin(&plugin, args.events, args.batch, round).await?;
            }
        }
        let (n, p) = (rate(args.events, native), rate(args.events, through));
        ratios.push(p / n);
        println!("{round:>5} {n:>14.0} {p:>14.0} {:>7.2}", p / n);
        lapin_total += native;
        plugin_total += through;
    }
    let total = args.events * args.rounds;
    let (n, p) = (rate(total, lapin_total), rate(total, plugin_total));
    ratios.sort_by(f64::total_cmp);
    println!(
        "total {n:>14.0} {p:>14.0} {:>7.2}   (median of rounds {:.2})",
        p / n,
        ratios[ratios.len() / 2]
    );

    admin
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    admin
        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await?;
    let _ = conn.close(200, "bench done".into()).await;
    Ok(())
}

fn rate(events: usize, took: Duration) -> f64 {
    events as f64 / took.as_secs_f64()
}

/// The `amqp` plugin from `target/plugins/` with a manifest for this run.
fn load_plugin(url: &str, exchange: &str) -> anyhow::Result<plugin::Plugin> {
    let manifest = format!(
        "name = \"amqp\"\nversion = \"0.1.0\"\nwit = \"outboxd:sink@0.1.0\"\n\
         [limits]\ndeadline = \"30s\"\nmax-batch = 1000\n\
         [capabilities]\namqp = {{ url = {url:?}, exchanges = [{exchange:?}] }}\n\
         [config]\nexchange = {exchange:?}\nrouting-key = \"documents.{{operation}}.{{type}}\"\n"
    );
    common::load_plugin("amqp", &manifest)
}

fn event(round: usize, i: usize) -> Event {
    Event {
        id: format!("bench-{round}-{i}"),
        source: "https://example.com/bench".into(),
        type_: "person".into(),
        subject: None,
        stream: format!("doc-{i}"),
        sequence: round as u64,
        time: "2026-11-30T01:02:03.456Z".into(),
        datacontenttype: Some("application/json".into()),
        dataschema: None,
        data: vec![b'x'; PAYLOAD],
        extensions: vec![("operation".into(), "update".into())],
        attempt: 1,
        ingested_at: "2026-11-30T01:02:03.456789Z".into(),
    }
}

async fn through_plugin(
    plugin: &plugin::Plugin,
    events: usize,
    batch: usize,
    round: usize,
) -> anyhow::Result<Duration> {
    let all: Vec<Event> = (0..events).map(|i| event(round, i)).collect();
    let started = Instant::now();
    for chunk in all.chunks(batch) {
        common::deliver_all(plugin, chunk).await?;
    }
    Ok(started.elapsed())
}

/// The same messages (body, properties, CloudEvents headers) from lapin,
/// `IN_FLIGHT` confirms outstanding at a time.
async fn plain_lapin(
    channel: &Channel,
    exchange: &str,
    events: usize,
    round: usize,
) -> anyhow::Result<Duration> {
    let all: Vec<Event> = (0..events).map(|i| event(round, i)).collect();
    let started = Instant::now();
    for chunk in all.chunks(IN_FLIGHT) {
        let mut confirms = Vec::with_capacity(chunk.len());
        for e in chunk {
            let mut headers = FieldTable::default();
            for (name, value) in [
                ("specversion", "1.0".to_string()),
                ("id", e.id.clone()),
                ("source", e.source.clone()),
                ("type", e.type_.clone()),
                ("time", e.time.clone()),
                ("partitionkey", e.stream.clone()),
                ("sequence", e.sequence.to_string()),
                ("operation", "update".to_string()),
            ] {
                headers.insert(
                    format!("cloudEvents_{name}").into(),
                    AMQPValue::LongString(LongString::from(value)),
                );
            }
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into())
                .with_message_id(e.id.as_str().into())
                .with_headers(headers);
            let options = BasicPublishOptions {
                mandatory: true,
                immediate: false,
            };
            let confirm = channel
                .basic_publish(
                    exchange.into(),
                    "documents.update.person".into(),
                    options,
                    &e.data,
                    properties,
                )
                .await?;
            confirms.push(confirm);
        }
        for confirm in futures::future::join_all(confirms).await {
            match confirm? {
                Confirmation::Ack(None) => {}
                other => anyhow::bail!("lapin publish not confirmed: {other:?}"),
            }
        }
    }
    Ok(started.elapsed())
}
