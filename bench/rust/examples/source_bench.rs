//! Messages consumed and stored per second by the `amqp` source, against a
//! plain lapin consumer that inserts the same rows with sqlx and
//! acknowledges after the commit, same broker, same PostgreSQL, same run,
//! alternating rounds (the disk's fsync time drifts, docs/measurements.md), with the
//! ratio.
//!
//! Each round and side gets a fresh database (outboxd's own migrations)
//! and a fresh durable queue filled with `--messages` persistent messages
//! before its consumer starts (JSON bodies of 256 bytes, `message-id`, the
//! stream in header `x-stream`, over `--streams` streams); the clock runs
//! from the consumer's start until the last message is stored and
//! acknowledged. Both sides take batches of `--batch` (prefetch twice
//! that) in one transaction each:
//!
//! - **outboxd**: the source itself ([`outboxd::sources::spawn_all`]) with
//!   `stream = "header:x-stream"`, no sinks (the store writes the events and
//!   their streams, no deliveries);
//! - **lapin + sqlx**: lock the batch's `outboxd.streams` rows, assign
//!   sequences, insert the events (`unnest`, `ON CONFLICT (id) DO NOTHING`),
//!   advance the streams, commit, then `basic.ack` with `multiple`.
//!
//! ```sh
//! cargo run --release -p outboxd-bench --example source_bench -- [--messages 20000] [--rounds 3] [--batch 200] [--streams 100]
//! ```
//!
//! Needs RabbitMQ (`OUTBOXD_BENCH_AMQP`, default 127.0.0.1:5672 guest) and
//! PostgreSQL (`OUTBOXD_TEST_PG`, default the local server, trust); drops
//! its databases and deletes its queues at the end. Prints one JSON line
//! per round and a last line with the medians and the ratio.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use outboxd::metrics::{Metrics, SourceOutcomeLabel};
use outboxd::sources::{SourceConfig, SourceContext, Statuses};
use sha2::{Digest, Sha256};
use sqlx::{Connection as _, PgPool};

struct Args {
    messages: usize,
    rounds: usize,
    batch: usize,
    streams: usize,
}

fn args() -> Args {
    let mut a = Args {
        messages: 20_000,
        rounds: 3,
        batch: 200,
        streams: 100,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = || {
            argv.get(i + 1)
                .and_then(|v| v.parse().ok())
                .expect("a number")
        };
        match argv[i].as_str() {
            "--messages" => a.messages = value(),
            "--rounds" => a.rounds = value(),
            "--batch" => a.batch = value(),
            "--streams" => a.streams = value(),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

fn amqp_url() -> String {
    std::env::var("OUTBOXD_BENCH_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn pg_admin() -> String {
    std::env::var("OUTBOXD_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A fresh database migrated with outboxd's migrations: (name, url).
async fn new_db(tag: &str) -> (String, String) {
    let name = format!(
        "outboxd_srcbench_{tag}_{}",
        hex::encode(rand::random::<[u8; 4]>())
    );
    let mut admin = sqlx::PgConnection::connect(&pg_admin()).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let url = format!("{}/{name}", pg_admin().rsplit_once('/').unwrap().0);
    let store = outboxd::store::open(&url).await.unwrap();
    store.migrate().await.unwrap();
    (name, url)
}

async fn drop_db(name: &str) {
    let mut admin = sqlx::PgConnection::connect(&pg_admin()).await.unwrap();
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await;
}

/// A durable queue holding `n` persistent messages.
async fn fill_queue(ch: &Channel, queue: &str, n: usize, streams: usize, dlx: &str) {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(LongString::from(dlx.as_bytes())),
    );
    // As the source declares it (`single-active-consumer` is on by default).
    arguments.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        arguments,
    )
    .await
    .unwrap();
    let pad = "x".repeat(256 - r#"{"k":"000000","pad":""}"#.len());
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut confirms = Vec::with_capacity(chunk.len());
        for &k in chunk {
            let mut headers = FieldTable::default();
            headers.insert(
                "x-stream".into(),
                AMQPValue::LongString(LongString::from(format!("s{}", k % streams).as_bytes())),
            );
            let properties = BasicProperties::default()
                .with_message_id(ShortString::from(format!("m-{k}")))
                .with_content_type("application/json".into())
                .with_delivery_mode(2)
                .with_headers(headers);
            let body = format!(r#"{{"k":"{k:06}","pad":"{pad}"}}"#);
            confirms.push(
                ch.basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    properties,
                )
                .await
                .unwrap(),
            );
        }
        for c in confirms {
            c.await.unwrap();
        }
    }
}

/// The `amqp` source consuming `queue` into the database at `url` until
/// `n` messages are stored and acknowledged: messages/s.
async fn run_outboxd(url: &str, queue: &str, n: usize, batch: usize) -> f64 {
    let store = outboxd::store::open(url).await.unwrap();
    let metrics = Metrics::new();
    let statuses = Arc::new(Statuses::default());
    let ctx = SourceContext {
        store,
        routes: Arc::new(outboxd::routing::Router::new(None, Vec::new()).unwrap()),
        metrics: metrics.clone(),
        wake: outboxd::wakeups::Wakeups::new(),
        db_timeout: outboxd::delivery::settings::DeliveryConfig::default().db_timeout,
        amqp: outboxd::plugin::amqp::AmqpPool::new(),
        telemetry: Default::default(),
    };
    let config: SourceConfig = toml::from_str(&format!(
        "kind = \"amqp\"\nurl = {:?}\nqueue = {queue:?}\nprefetch = {}\nbatch-size = {batch}\n\
         stream = \"header:x-stream\"\n",
        amqp_url(),
        batch * 2
    ))
    .unwrap();
    let sources: BTreeMap<String, SourceConfig> = [("bench".to_string(), config)].into();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let label = SourceOutcomeLabel {
        source: "bench".into(),
        outcome: "stored".into(),
    };
    let started = Instant::now();
    let tasks = outboxd::sources::spawn_all(&sources, ctx, statuses, stop_rx);
    while (metrics.source_messages.get_or_create(&label).get() as usize) < n {
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "outboxd side stalled"
        );
    }
    let elapsed = started.elapsed();
    let _ = stop.send(true);
    for t in tasks {
        let _ = t.await;
    }
    n as f64 / elapsed.as_secs_f64()
}

/// A plain lapin consumer storing the same rows with sqlx: messages/s.
async fn run_plain(url: &str, queue: &str, n: usize, batch: usize) -> f64 {
    let pool = PgPool::connect(url).await.unwrap();
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let started = Instant::now();
    let ch = conn.create_channel().await.unwrap();
    ch.basic_qos((batch * 2) as u16, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "plain".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut done = 0usize;
    while done < n {
        let first = consumer.next().await.unwrap().unwrap();
        let mut deliveries = vec![first];
        let until = tokio::time::Instant::now() + Duration::from_millis(5);
        while deliveries.len() < batch {
            match tokio::time::timeout_at(until, consumer.next()).await {
                Ok(Some(Ok(d))) => deliveries.push(d),
                _ => break,
            }
        }
        let mut ids = Vec::new();
        let mut streams = Vec::new();
        let mut datas = Vec::new();
        let mut hashes = Vec::new();
        let mut types = Vec::new();
        for d in &deliveries {
            ids.push(d.properties.message_id().as_ref().unwrap().to_string());
            let stream = match d
                .properties
                .headers()
                .as_ref()
                .unwrap()
                .inner()
                .get("x-stream")
            {
                Some(AMQPValue::LongString(s)) => {
                    String::from_utf8_lossy(s.as_bytes()).into_owned()
                }
                _ => panic!("no x-stream"),
            };
            streams.push(stream);
            hashes.push(hex::encode(Sha256::digest(&d.data)));
            datas.push(d.data.clone());
            types.push(d.routing_key.to_string());
        }
        let mut tx = pool.begin().await.unwrap();
        let mut unique: Vec<&str> = streams.iter().map(String::as_str).collect();
        unique.sort_unstable();
        unique.dedup();
        sqlx::query(
            "INSERT INTO outboxd.streams (stream, last_sequence) SELECT s, 0 FROM unnest($1::text[]) AS s \
             ORDER BY s COLLATE \"C\" ON CONFLICT (stream) DO NOTHING",
        )
        .bind(&unique)
        .execute(&mut *tx)
        .await
        .unwrap();
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT stream, last_sequence FROM outboxd.streams WHERE stream = ANY($1) \
             ORDER BY stream COLLATE \"C\" FOR UPDATE",
        )
        .bind(&unique)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        let mut last: BTreeMap<String, i64> = rows.into_iter().collect();
        let seqs: Vec<i64> = streams
            .iter()
            .map(|s| {
                let l = last.get_mut(s).unwrap();
                *l += 1;
                *l
            })
            .collect();
        sqlx::query(
            "INSERT INTO outboxd.events (id, source, type, datacontenttype, stream, sequence, data, data_format, content_hash) \
             SELECT id, '/amqp/bench', type, 'application/json', stream, seq, data, 'json', hash \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bytea[], $6::text[]) \
               AS t(id, type, stream, seq, data, hash) ON CONFLICT (id) DO NOTHING",
        )
        .bind(&ids)
        .bind(&types)
        .bind(&streams)
        .bind(&seqs)
        .bind(&datas)
        .bind(&hashes)
        .execute(&mut *tx)
        .await
        .unwrap();
        let (names, values): (Vec<String>, Vec<i64>) = last.into_iter().unzip();
        sqlx::query(
            "UPDATE outboxd.streams s SET last_sequence = v.n FROM unnest($1::text[], $2::bigint[]) AS v(stream, n) \
             WHERE s.stream = v.stream",
        )
        .bind(&names)
        .bind(&values)
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let tag = deliveries.last().unwrap().delivery_tag;
        ch.basic_ack(tag, BasicAckOptions { multiple: true })
            .await
            .unwrap();
        done += deliveries.len();
    }
    let elapsed = started.elapsed();
    let _ = conn.close(200, "done".into()).await;
    pool.close().await;
    n as f64 / elapsed.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let a = args();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("outboxd=warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("RabbitMQ (OUTBOXD_BENCH_AMQP)");
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let (mut ours, mut plain) = (Vec::new(), Vec::new());
    for round in 0..a.rounds {
        // Alternate which side goes first.
        let order = if round % 2 == 0 {
            ["outboxd", "plain"]
        } else {
            ["plain", "outboxd"]
        };
        for side in order {
            let queue = format!(
                "outboxd-srcbench-{side}-{}",
                hex::encode(rand::random::<[u8; 4]>())
            );
            let dlx = format!("{queue}.dead-letter");
            fill_queue(&ch, &queue, a.messages, a.streams, &dlx).await;
            let (db, url) = new_db(side).await;
            let rate = if side == "outboxd" {
                run_outboxd(&url, &queue, a.messages, a.batch).await
            } else {
                run_plain(&url, &queue, a.messages, a.batch).await
            };
            let rows: i64 = {
                let pool = PgPool::connect(&url).await.unwrap();
                let n = sqlx::query_scalar("SELECT count(*) FROM outboxd.events")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                pool.close().await;
                n
            };
            assert_eq!(
                rows as usize, a.messages,
                "{side}: every message stored once"
            );
            println!(
                "{}",
                serde_json::json!({"round": round, "side": side, "messages": a.messages, "msgs_per_s": rate.round()})
            );
            if side == "outboxd" {
                ours.push(rate)
            } else {
                plain.push(rate)
            }
            for q in [queue.clone(), format!("{queue}.dead")] {
                let _ = ch
                    .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
            let _ = ch
                .exchange_delete(dlx.as_str().into(), Default::default())
                .await;
            drop_db(&db).await;
        }
    }
    let (o, p) = (median(ours), median(plain));
    println!(
        "{}",
        serde_json::json!({
            "stage": "source",
            "messages": a.messages,
            "rounds": a.rounds,
            "batch": a.batch,
            "outboxd_msgs_per_s": o.round(),
            "lapin_sqlx_msgs_per_s": p.round(),
            "ratio": (o / p * 100.0).round() / 100.0,
        })
    );
    let _ = conn.close(200, "done".into()).await;
}
