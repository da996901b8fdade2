//! The Neo4j outbox relay, measured: nodes relayed per second by the
//! `neo4j` source with 1 and 3 relays, against a plain neo4rs + sqlx
//! program doing the same read, store and mark in the same batches, and
//! the claim's time at two backlog sizes, with the ratios.
//!
//! - **Relays**: a backlog of `--nodes` pending outbox nodes over
//!   `--streams` streams (the shape of `tests/integration_neo4j.rs`: id
//!   `S<stream>-<version>`, `packetId`, gapless `streamVersion`, a JSON
//!   `payload` of about 256 bytes) is relayed by R `outboxd run` processes
//!   (the binary beside this example's folder, or `--outboxd`) on one fresh
//!   PostgreSQL database, each with the `neo4j` source (batch 100) and the
//!   native discard sink (`builtin = "discard"`). *Relayed/s* is the nodes
//!   marked delivered divided by the time from the first mark to the last
//!   (Neo4j's own clock, `deliveredAt`); *wall/s* divides by the time from
//!   the processes' start to the last mark. Every node must end delivered
//!   and stored once (`outboxd.events`).
//! - **Plain**: one loop that reads 100 pending nodes through the
//!   `(status, eventId)` index, inserts them as events (and their streams)
//!   in one PostgreSQL transaction, and marks them delivered — the naive
//!   dispatcher, without the lock-first claim, the head check, the lease or
//!   the sink's deliveries outboxd also queues and finishes.
//! - **Claim**: one `Outbox::claim(100)` (shortlist + lock-first claim) on
//!   a backlog of `--claim` sizes (random UUID ids over 1,000 streams, as
//!   the claim test of `tests/integration_neo4j.rs`), each claim's nodes
//!   then finished untimed; median and mean per backlog.
//!
//! - **Takeover** (`--takeover`, run on its own): a backlog of
//!   `--vault-nodes` outbox nodes over `--vault-packets` packets written in
//!   the vault's own shape and types (`Date.now()` FLOATs, ISO
//!   `occurredAt`, `dataJson`), drained into one awareness-shaped receiver
//!   (`POST /ingest`, 200) by D of the vault's dispatchers
//!   (`tests/vault/vault.mjs dispatch`, its protocol with its defaults:
//!   batch 50, poll 1 s, lease 30 s) and, on a fresh backlog, by R outboxd
//!   processes with `deploy/vault/` (`delivered-when = "acknowledged"`, the
//!   `awareness` sink). Both do the same safe work: lock-first lease, one
//!   node per packet at a time, marked delivered only once the receiver
//!   answered. *Delivered/s* is the nodes marked delivered over first →
//!   last `acknowledgedAt`, within `--vault-window` seconds.
//!
//! ```sh
//! scripts/setup.sh    # Java 17 + Maven; builds tests/neo4j once
//! cargo build --release -p outboxd --bin outboxd && cargo build --release -p outboxd-bench --example neo4j_bench
//! target/release/examples/neo4j_bench [--nodes 10000] [--streams 100] [--relays 1,3] \
//!     [--claim 10000,100000] [--claim-samples 20] [--bolt bolt://127.0.0.1:7687] [--outboxd PATH]
//! target/release/examples/neo4j_bench --takeover [--vault-nodes 100000] [--vault-packets 1000] \
//!     [--dispatchers 1,3] [--relays 1,3] [--vault-window 120]
//! ```
//!
//! Without `--bolt` it starts the embedded Neo4j 5.26 of `tests/neo4j/`
//! (built into `target/neo4j-embedded/`) on a free port with Neo4j's JVM
//! flags and stops it at the end. PostgreSQL from `OUTBOXD_TEST_PG`
//! (default the local server, trust); its databases are dropped at the
//! end. Prints one line per measurement on stderr and one JSON line at the
//! end on stdout. Must never leave a child process behind: the Neo4j and
//! the relays are killed on every path out of `main`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use neo4rs::{query, Graph};
use outboxd::sources::neo4j::{Neo4jSourceConfig, Outbox};
use serde_json::json;
use sqlx::Connection as _;

/// Nodes per claim and per store transaction, both sides.
const BATCH: usize = 100;
/// Nodes created per Neo4j transaction while filling (setup, not timed).
const FILL_CHUNK: usize = 10_000;
/// The JVM flags Neo4j's own launcher passes that an embedded Neo4j 5.26
/// on Java 17 needs (as `tests/common/neo4j.rs`), plus a heap cap.
const JVM_FLAGS: &[&str] = &[
    "-Xmx1g",
    "-XX:+UseG1GC",
    "-XX:-OmitStackTraceInFastThrow",
    "-Djdk.nio.maxCachedBufferSize=1024",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--enable-native-access=ALL-UNNAMED",
    "-Dlog4j2.disable.jmx=true",
];
/// Page cache of the embedded Neo4j, MiB (a 1M-node backlog fits).
const PAGE_CACHE_MB: &str = "512";
/// Longest wait for a relay run, the Neo4j's start, or a fill.
const RUN_TIMEOUT: Duration = Duration::from_secs(1800);

struct Args {
    nodes: usize,
    streams: usize,
    relays: Vec<usize>,
    claim: Vec<usize>,
    claim_samples: usize,
    bolt: Option<String>,
    outboxd: Option<PathBuf>,
    takeover: bool,
    vault_nodes: usize,
    vault_packets: usize,
    dispatchers: Vec<usize>,
    vault_window: Duration,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        nodes: 10_000,
        streams: 100,
        relays: vec![1, 3],
        claim: vec![10_000, 100_000],
        claim_samples: 20,
        bolt: None,
        outboxd: None,
        takeover: false,
        vault_nodes: 10_000,
        vault_packets: 100,
        dispatchers: vec![1, 3],
        vault_window: Duration::from_secs(120),
    };
    let list = |v: &str| -> anyhow::Result<Vec<usize>> {
        v.split(',')
            .map(|x| x.parse().context("a comma list of numbers"))
            .collect()
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--takeover" {
            a.takeover = true;
            continue;
        }
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--nodes" => a.nodes = value.parse()?,
            "--streams" => a.streams = value.parse()?,
            "--relays" => a.relays = list(&value)?,
            "--claim" => a.claim = list(&value)?,
            "--claim-samples" => a.claim_samples = value.parse()?,
            "--bolt" => a.bolt = Some(value),
            "--outboxd" => a.outboxd = Some(value.into()),
            "--vault-nodes" => a.vault_nodes = value.parse()?,
            "--vault-packets" => a.vault_packets = value.parse()?,
            "--dispatchers" => a.dispatchers = list(&value)?,
            "--vault-window" => a.vault_window = Duration::from_secs(value.parse()?),
            other => bail!(
                "unknown flag {other} (known: --nodes, --streams, --relays, --claim, \
                 --claim-samples, --bolt, --outboxd, --takeover, --vault-nodes, --vault-packets, \
                 --dispatchers, --vault-window)"
            ),
        }
    }
    ensure!(
        a.nodes > 0 && a.streams > 0,
        "--nodes and --streams must be > 0"
    );
    a.claim.sort_unstable();
    Ok(a)
}

fn repo() -> PathBuf {
    // This crate is bench/rust/.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

fn pg_admin() -> String {
    std::env::var("OUTBOXD_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The embedded Neo4j of `tests/neo4j/` on a free port: (its Bolt URL, the
/// process, its home). It exits when its standard input closes.
fn start_neo4j() -> anyhow::Result<(String, Killed, tempfile::TempDir)> {
    let out = repo().join("target/neo4j-embedded");
    ensure!(
        out.join("lib").is_dir() && out.join("classes").is_dir(),
        "{} is not built: run scripts/setup.sh (or mvn -q -B package -DskipTests -f tests/neo4j/pom.xml)",
        out.display()
    );
    let home = tempfile::tempdir()?;
    let port = free_port();
    let classpath = format!(
        "{}:{}/*",
        out.join("classes").display(),
        out.join("lib").display()
    );
    let mut child = Command::new("java")
        .args(JVM_FLAGS)
        .args(["-cp", &classpath, "outboxd.testing.EmbeddedNeo4j"])
        .arg(home.path().join("db"))
        .arg(port.to_string())
        .arg(PAGE_CACHE_MB)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(home.path().join("neo4j.log"))?)
        .spawn()
        .context("run `java` (Java 17: scripts/setup.sh)")?;
    let stdout = child.stdout.take().unwrap();
    let child = Killed(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("NEO4J READY") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(180)).with_context(|| {
        let log = std::fs::read_to_string(home.path().join("neo4j.log")).unwrap_or_default();
        let tail: String = log
            .chars()
            .rev()
            .take(2000)
            .collect::<String>()
            .chars()
            .rev()
            .collect();
        format!("the embedded Neo4j did not start:\n{tail}")
    })?;
    Ok((format!("bolt://127.0.0.1:{port}"), child, home))
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", hex::encode(rand::random::<[u8; 5]>()))
}

/// The source's settings for `label` on `uri`, batch [`BATCH`].
fn source_config(uri: &str, label: &str) -> Neo4jSourceConfig {
    Neo4jSourceConfig {
        url: uri.to_string(),
        label: label.to_string(),
        batch_size: BATCH as u32,
        poll_interval: Duration::from_millis(100),
        ..Neo4jSourceConfig::default()
    }
}

/// The relay's indexes on `label` (as outboxd creates them at start),
/// online before anything is timed.
async fn indexes(uri: &str, label: &str) -> anyhow::Result<Outbox> {
    let outbox = Outbox::connect(&source_config(uri, label), "")?;
    outbox.ensure_indexes().await?;
    outbox
        .graph()
        .run(query("CALL db.awaitIndexes(300)"))
        .await?;
    Ok(outbox)
}

/// `nodes` pending outbox nodes over `streams` streams in the tests'
/// shape: id `S<stream>-<version>`, versions 1.. per stream.
async fn fill_relay_backlog(
    g: &Graph,
    label: &str,
    nodes: usize,
    streams: usize,
) -> anyhow::Result<()> {
    let pad = "x".repeat(256 - r#"{"n": 0000000, "pad": ""}"#.len());
    let mut from = 0;
    while from < nodes {
        let to = (from + FILL_CHUNK).min(nodes);
        g.run(
            query(&format!(
                "UNWIND range($from, $to - 1) AS k \
                 WITH k, k % $streams AS s, k / $streams + 1 AS v \
                 CREATE (:`{label}` {{eventId: 'S' + toString(s) + '-' + toString(v), \
                   packetId: 'S' + toString(s), streamVersion: v, status: 'pending', attempts: 0, \
                   nextAttemptAt: datetime(), createdAt: datetime(), eventType: 'com.example.changed', \
                   payload: '{{\"n\": ' + toString(v) + ', \"pad\": \"{pad}\"}}'}})"
            ))
            .param("from", from as i64)
            .param("to", to as i64)
            .param("streams", streams as i64),
        )
        .await?;
        from = to;
    }
    Ok(())
}

/// (delivered count, milliseconds from the first `deliveredAt` to the last).
async fn delivered(g: &Graph, label: &str) -> anyhow::Result<(usize, i64)> {
    let mut rows = g
        .execute(query(&format!(
            "MATCH (n:`{label}`) WHERE n.status = 'delivered' \
             WITH count(n) AS c, min(n.deliveredAt) AS a, max(n.deliveredAt) AS b \
             RETURN c, CASE WHEN c = 0 THEN 0 ELSE duration.inSeconds(a, b).milliseconds END AS ms"
        )))
        .await?;
    let row = rows.next().await?.context("a count row")?;
    Ok((row.get::<i64>("c")? as usize, row.get::<i64>("ms")?))
}

/// A fresh database with outboxd's migrations: (name, url).
async fn new_db(tag: &str) -> anyhow::Result<(String, String)> {
    let name = format!(
        "outboxd_neo4jbench_{tag}_{}",
        hex::encode(rand::random::<[u8; 4]>())
    );
    let mut admin = sqlx::PgConnection::connect(&pg_admin()).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await?;
    let url = format!("{}/{name}", pg_admin().rsplit_once('/').unwrap().0);
    outboxd::store::open(&url).await?.migrate().await?;
    Ok((name, url))
}

/// Drop the databases an earlier run left behind when it was stopped
/// before its clean-up (`outboxd_neo4jbench_*`); returns their names.
async fn drop_stale_dbs() -> anyhow::Result<Vec<String>> {
    let mut admin = sqlx::PgConnection::connect(&pg_admin()).await?;
    let stale: Vec<String> = sqlx::query_scalar(
        "SELECT datname::text FROM pg_database WHERE datname LIKE 'outboxd\\_neo4jbench\\_%'",
    )
    .fetch_all(&mut admin)
    .await?;
    for name in &stale {
        drop_db(name).await;
    }
    Ok(stale)
}

/// The warnings and errors of relay `i`'s log (at most `most` lines), so a
/// relay that struggled shows as more than a slow figure.
fn log_trouble(dir: &Path, i: usize, most: usize) -> Vec<String> {
    let log = std::fs::read_to_string(dir.join(format!("relay{i}.log"))).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .take(most)
        .map(str::to_string)
        .collect()
}

async fn drop_db(name: &str) {
    if let Ok(mut admin) = sqlx::PgConnection::connect(&pg_admin()).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut admin)
            .await;
    }
}

async fn stored_events(url: &str) -> anyhow::Result<i64> {
    let mut c = sqlx::PgConnection::connect(url).await?;
    Ok(sqlx::query_scalar("SELECT count(*) FROM outboxd.events")
        .fetch_one(&mut c)
        .await?)
}

/// One relay measurement: its rates and checks.
struct RelayRun {
    relayed_per_s: f64,
    wall_per_s: f64,
    stored: i64,
}

impl RelayRun {
    fn json(&self) -> serde_json::Value {
        json!({"relayed_per_s": self.relayed_per_s.round(), "wall_per_s": self.wall_per_s.round(),
               "stored": self.stored})
    }
}

/// `relays` `outboxd run` processes on one fresh database relay a fresh
/// backlog of `nodes` into the native discard sink.
async fn run_outboxd(
    bin: &Path,
    uri: &str,
    nodes: usize,
    streams: usize,
    relays: usize,
) -> anyhow::Result<RelayRun> {
    let label = unique("Bench");
    let outbox = indexes(uri, &label).await?;
    fill_relay_backlog(outbox.graph(), &label, nodes, streams).await?;
    let (db, url) = new_db(&format!("r{relays}")).await?;
    let dir = tempfile::tempdir()?;
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins)?;
    std::fs::write(
        plugins.join("discard.toml"),
        "name = \"discard\"\nversion = \"0.1.0\"\nwit = \"outboxd:sink@0.1.0\"\nbuiltin = \"discard\"\n\
         [limits]\ndeadline = \"30s\"\nmax-batch = 100\n",
    )?;
    let started = Instant::now();
    let mut children = Vec::new();
    for i in 0..relays {
        let log = std::fs::File::create(dir.path().join(format!("relay{i}.log")))?;
        let child = Command::new(bin)
            .arg("run")
            .env("OUTBOXD_DATABASE_URL", &url)
            .env("OUTBOXD_LISTEN", format!("127.0.0.1:{}", free_port()))
            .env("OUTBOXD_PLUGINS_DIR", &plugins)
            .env("OUTBOXD_DATA_DIR", dir.path().join(format!("data{i}")))
            .env("OUTBOXD_SOURCES__GRAPH__KIND", "neo4j")
            .env("OUTBOXD_SOURCES__GRAPH__URL", uri)
            .env("OUTBOXD_SOURCES__GRAPH__LABEL", &label)
            .env("OUTBOXD_SOURCES__GRAPH__BATCH_SIZE", BATCH.to_string())
            .env("OUTBOXD_SOURCES__GRAPH__POLL_INTERVAL", "100ms")
            .env(
                "RUST_LOG",
                std::env::var("BENCH_OUTBOXD_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("run {}", bin.display()))?;
        children.push(Killed(child));
    }
    let result = async {
        loop {
            let (done, _) = delivered(outbox.graph(), &label).await?;
            if done >= nodes {
                break;
            }
            for (i, c) in children.iter_mut().enumerate() {
                if let Some(status) = c.0.try_wait()? {
                    let log = std::fs::read_to_string(dir.path().join(format!("relay{i}.log")))?;
                    bail!("relay {i} exited ({status}) after {done} of {nodes} nodes:\n{log}");
                }
            }
            ensure!(
                started.elapsed() < RUN_TIMEOUT,
                "only {done} of {nodes} relayed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let wall = started.elapsed();
        let (done, span_ms) = delivered(outbox.graph(), &label).await?;
        let stored = stored_events(&url).await?;
        ensure!(
            stored as usize == nodes,
            "{stored} events stored for {nodes} nodes"
        );
        Ok(RelayRun {
            relayed_per_s: done as f64 / (span_ms.max(1) as f64 / 1e3),
            wall_per_s: done as f64 / wall.as_secs_f64(),
            stored,
        })
    }
    .await;
    drop(children);
    for i in 0..relays {
        let trouble = log_trouble(dir.path(), i, 5);
        if !trouble.is_empty() {
            eprintln!(
                "neo4j_bench: relay {i} of {relays} logged warnings or errors (first {}):\n{}",
                trouble.len(),
                trouble.join("\n")
            );
        }
    }
    drop_db(&db).await;
    delete_label(outbox.graph(), &label).await;
    result
}

/// The plain program: read a batch of pending nodes, store them as events
/// in one transaction, mark them delivered; until none is pending. The read
/// orders by both properties of the `(status, eventId)` index, so Neo4j
/// reads the index in order and stops after the batch (ordered by
/// `eventId` alone it reads every pending node and sorts them).
async fn run_plain(uri: &str, nodes: usize, streams: usize) -> anyhow::Result<RelayRun> {
    let label = unique("Plain");
    let outbox = indexes(uri, &label).await?;
    let g = outbox.graph().clone();
    fill_relay_backlog(&g, &label, nodes, streams).await?;
    let (db, url) = new_db("plain").await?;
    let pool = sqlx::PgPool::connect(&url).await?;
    let read = format!(
        "MATCH (n:`{label}`) WHERE n.status = 'pending' AND n.eventId > '' \
         WITH n ORDER BY n.status ASC, n.eventId ASC LIMIT $limit \
         RETURN n.eventId AS id, n.packetId AS stream, n.streamVersion AS version, \
           n.eventType AS type, n.payload AS payload"
    );
    let mark = format!(
        "UNWIND $ids AS id MATCH (n:`{label}`) WHERE n.eventId = id \
         SET n.status = 'delivered', n.deliveredAt = datetime()"
    );
    let started = Instant::now();
    let result = async {
        loop {
            let mut rows = g.execute(query(&read).param("limit", BATCH as i64)).await?;
            let (mut ids, mut stream, mut seq, mut types, mut data, mut hashes) =
                (vec![], vec![], vec![], vec![], vec![], vec![]);
            while let Some(row) = rows.next().await? {
                let payload: String = row.get("payload")?;
                hashes.push(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(payload.as_bytes())));
                data.push(payload.into_bytes());
                ids.push(row.get::<String>("id")?);
                stream.push(row.get::<String>("stream")?);
                seq.push(row.get::<i64>("version")?);
                types.push(row.get::<String>("type")?);
            }
            if ids.is_empty() {
                break;
            }
            let mut tx = pool.begin().await?;
            sqlx::query(
                "INSERT INTO outboxd.streams (stream, last_sequence) \
                 SELECT s, max(v) FROM unnest($1::text[], $2::bigint[]) AS t(s, v) GROUP BY s \
                 ORDER BY s COLLATE \"C\" \
                 ON CONFLICT (stream) DO UPDATE SET last_sequence = \
                   GREATEST(outboxd.streams.last_sequence, EXCLUDED.last_sequence)",
            )
            .bind(&stream)
            .bind(&seq)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO outboxd.events (id, source, type, datacontenttype, stream, sequence, data, data_format, content_hash) \
                 SELECT id, '/neo4j/bench', type, 'application/json', stream, seq, data, 'json', hash \
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bytea[], $6::text[]) \
                   AS t(id, type, stream, seq, data, hash) ON CONFLICT (id) DO NOTHING",
            )
            .bind(&ids)
            .bind(&types)
            .bind(&stream)
            .bind(&seq)
            .bind(&data)
            .bind(&hashes)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            g.run(query(&mark).param("ids", ids)).await?;
            ensure!(started.elapsed() < RUN_TIMEOUT, "the plain program did not finish");
        }
        let wall = started.elapsed();
        let (done, span_ms) = delivered(&g, &label).await?;
        ensure!(done == nodes, "plain marked {done} of {nodes}");
        let stored = stored_events(&url).await?;
        ensure!(stored as usize == nodes, "{stored} events stored for {nodes} nodes");
        Ok(RelayRun {
            relayed_per_s: done as f64 / (span_ms.max(1) as f64 / 1e3),
            wall_per_s: done as f64 / wall.as_secs_f64(),
            stored,
        })
    }
    .await;
    pool.close().await;
    drop_db(&db).await;
    delete_label(&g, &label).await;
    result
}

/// Delete a run's nodes (bounded transactions), so the next run's Neo4j
/// holds only its own backlog.
async fn delete_label(g: &Graph, label: &str) {
    let q = format!("MATCH (n:`{label}`) WITH n LIMIT 10000 DETACH DELETE n RETURN count(*) AS c");
    loop {
        let deleted = async {
            let mut rows = g.execute(query(&q)).await?;
            let row = rows.next().await?.context("a count row")?;
            anyhow::Ok(row.get::<i64>("c")?)
        }
        .await;
        match deleted {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                eprintln!("neo4j_bench: could not delete the nodes of {label}: {e}");
                break;
            }
        }
    }
}

/// Pending nodes with random UUID ids over 1,000 streams, versions after
/// `from` (the claim test's shape).
async fn fill_claim_backlog(g: &Graph, label: &str, from: usize, to: usize) -> anyhow::Result<()> {
    let mut at = from;
    while at < to {
        let end = (at + FILL_CHUNK).min(to);
        g.run(
            query(&format!(
                "UNWIND range($from, $to - 1) AS i CREATE (:`{label}` {{eventId: randomUUID(), \
                 packetId: 'S' + toString(i % 1000), streamVersion: i, status: 'pending', \
                 attempts: 0, createdAt: datetime(), eventType: 't', payload: '{{}}'}})"
            ))
            .param("from", at as i64 + 1)
            .param("to", end as i64 + 1),
        )
        .await?;
        at = end;
    }
    Ok(())
}

/// The claim's time at each backlog of `sizes`: rows of JSON.
async fn claim_cost(
    uri: &str,
    sizes: &[usize],
    samples: usize,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let label = unique("Claim");
    let outbox = indexes(uri, &label).await?;
    let mut rows = Vec::new();
    let mut filled = 0;
    for &size in sizes {
        let t = Instant::now();
        fill_claim_backlog(outbox.graph(), &label, filled, size).await?;
        filled = size;
        outbox
            .graph()
            .run(query("CALL db.awaitIndexes(300)"))
            .await?;
        eprintln!(
            "neo4j_bench: claim backlog {size} filled in {:.1}s",
            t.elapsed().as_secs_f64()
        );
        let mut times = Vec::new();
        let mut claimed = 0;
        for i in 0..samples + 3 {
            let t = Instant::now();
            let nodes = outbox.claim(BATCH).await?;
            let took = t.elapsed();
            if i >= 3 {
                times.push(took.as_secs_f64() * 1e3);
                claimed += nodes.len();
            }
            if let Some(first) = nodes.first() {
                let ids = nodes.iter().map(|n| n.event_id.clone()).collect();
                outbox.finish_delivered(&first.lease_token, ids).await?;
            }
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let p50 = times[times.len() / 2];
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        eprintln!("neo4j_bench: claim at {size} pending: p50 {p50:.1} ms, mean {mean:.1} ms, {claimed} claimed");
        rows.push(
            json!({"pending": size, "p50_ms": (p50 * 100.0).round() / 100.0,
                         "mean_ms": (mean * 100.0).round() / 100.0,
                         "claimed_per_call": claimed as f64 / samples as f64}),
        );
    }
    delete_label(outbox.graph(), &label).await;
    Ok(rows)
}

fn ratio(a: f64, b: f64) -> f64 {
    (a / b * 100.0).round() / 100.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let bin = match &a.outboxd {
        Some(p) => p.clone(),
        // target/PROFILE/examples/neo4j_bench → target/PROFILE/outboxd
        None => std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .context("no folder above the example")?
            .join("outboxd"),
    };
    ensure!(
        bin.exists(),
        "{} is missing: build it (cargo build -p outboxd --bin outboxd) or pass --outboxd",
        bin.display()
    );
    let stale = drop_stale_dbs().await?;
    if !stale.is_empty() {
        eprintln!(
            "neo4j_bench: dropped {} database(s) an earlier run left: {}",
            stale.len(),
            stale.join(", ")
        );
    }
    let (uri, _neo4j) = match &a.bolt {
        Some(uri) => (uri.clone(), None),
        None => {
            let (uri, child, home) = start_neo4j()?;
            (uri, Some((child, home)))
        }
    };
    if a.takeover {
        return takeover(&a, &bin, &uri).await;
    }
    let mut relays = Vec::new();
    let mut plain = None;
    for (i, &r) in a.relays.iter().enumerate() {
        let run = run_outboxd(&bin, &uri, a.nodes, a.streams, r).await?;
        eprintln!(
            "neo4j_bench: {r} relay(s): {:.0} nodes/s relayed ({:.0}/s wall), {} nodes",
            run.relayed_per_s, run.wall_per_s, a.nodes
        );
        relays.push((r, run));
        if i == 0 {
            // The plain program right after the first outboxd run, so the
            // pair sees the same disk.
            let run = run_plain(&uri, a.nodes, a.streams).await?;
            eprintln!(
                "neo4j_bench: plain neo4rs + sqlx: {:.0} nodes/s ({:.0}/s wall)",
                run.relayed_per_s, run.wall_per_s
            );
            plain = Some(run);
        }
    }
    let claim = claim_cost(&uri, &a.claim, a.claim_samples).await?;
    let rate = |n: usize| {
        relays
            .iter()
            .find(|(r, _)| *r == n)
            .map(|(_, run)| run.relayed_per_s)
    };
    let claim_ratio = match (claim.first(), claim.last()) {
        (Some(s), Some(l)) if claim.len() > 1 => Some(ratio(
            l["p50_ms"].as_f64().unwrap_or(0.0),
            s["p50_ms"].as_f64().unwrap_or(1.0),
        )),
        _ => None,
    };
    let relays_json: Vec<serde_json::Value> = relays
        .iter()
        .map(|(r, run)| {
            let mut v = run.json();
            v["relays"] = json!(r);
            v
        })
        .collect();
    println!(
        "{}",
        json!({
            "stage": "neo4j",
            "nodes": a.nodes,
            "streams": a.streams,
            "batch": BATCH,
            "relays": relays_json,
            "plain": plain.as_ref().map(RelayRun::json),
            "outboxd_1_vs_plain": match (rate(1), &plain) {
                (Some(o), Some(p)) => Some(ratio(o, p.relayed_per_s)),
                _ => None,
            },
            "relays_3_vs_1": match (rate(3), rate(1)) {
                (Some(t), Some(o)) => Some(ratio(t, o)),
                _ => None,
            },
            "claim": claim,
            "claim_samples": a.claim_samples,
            "claim_large_vs_small": claim_ratio,
        })
    );
    Ok(())
}

/// `nodes` outbox nodes over `packets` packets as the vault writes them
/// (`tests/vault/vault.mjs write`): epoch-millisecond FLOATs, ISO text
/// `occurredAt`, JSON text `dataJson`, integer `streamVersion` and
/// `attempts`, no type property. Written as if one a millisecond, packets
/// taking turns (the `createdAt` order the vault's dispatcher reads them
/// in), the last one now.
async fn fill_vault_backlog(
    g: &Graph,
    label: &str,
    nodes: usize,
    packets: usize,
) -> anyhow::Result<()> {
    let mut from = 0;
    while from < nodes {
        let to = (from + FILL_CHUNK).min(nodes);
        g.run(
            query(&format!(
                "UNWIND range($from, $to - 1) AS k \
                 WITH k, k % $packets AS p, k / $packets + 1 AS v, \
                   toFloat(datetime().epochMillis - $nodes + k) AS now \
                 CREATE (:`{label}` {{eventId: 'P' + toString(p) + '-' + toString(v), \
                   packetId: 'P' + toString(p), schemaId: '550e8400-e29b-41d4-a716-446655440000', \
                   w3id: '@user-' + toString(p), evaultPublicKey: 'z6Mk-bench', \
                   dataJson: '{{\"packet\": ' + toString(p) + ', \"v\": ' + toString(v) + '}}', \
                   operation: 'update', occurredAt: toString(datetime()), streamVersion: v, \
                   status: 'pending', attempts: 0, nextAttemptAt: now, createdAt: now}})"
            ))
            .param("from", from as i64)
            .param("to", to as i64)
            .param("packets", packets as i64)
            .param("nodes", nodes as i64),
        )
        .await?;
        from = to;
    }
    Ok(())
}

/// (delivered count, milliseconds from the first `acknowledgedAt` to the
/// last).
async fn acknowledged(g: &Graph, label: &str) -> anyhow::Result<(usize, i64)> {
    let mut rows = g
        .execute(query(&format!(
            "MATCH (n:`{label}`) WHERE n.status = 'delivered' \
             WITH count(n) AS c, min(n.acknowledgedAt) AS a, max(n.acknowledgedAt) AS b \
             RETURN c, CASE WHEN c = 0 THEN 0 ELSE toInteger(b - a) END AS ms"
        )))
        .await?;
    let row = rows.next().await?.context("a count row")?;
    Ok((row.get::<i64>("c")? as usize, row.get::<i64>("ms")?))
}

/// An awareness service's `POST /ingest` on loopback that answers 200 to
/// every post; returns its origin and the count of posts.
async fn ingest_receiver() -> anyhow::Result<(String, std::sync::Arc<std::sync::atomic::AtomicU64>)>
{
    use std::sync::atomic::{AtomicU64, Ordering};
    let posts = std::sync::Arc::new(AtomicU64::new(0));
    let counted = posts.clone();
    let app = axum::Router::new().route(
        "/ingest",
        axum::routing::post(move |_body: bytes::Bytes| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::Relaxed);
                r#"{"ok":true}"#
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((format!("http://{addr}"), posts))
}

/// One side of the takeover comparison: what drained how much, how fast.
struct Drain {
    delivered: usize,
    per_s: f64,
}

/// Wait until every node of `label` is delivered or `window` passed, with
/// `children` running; then the rate over first → last `acknowledgedAt`.
async fn drain(
    g: &Graph,
    label: &str,
    nodes: usize,
    window: Duration,
    children: &mut [Killed],
    what: &str,
) -> anyhow::Result<Drain> {
    let started = Instant::now();
    loop {
        let (done, _) = acknowledged(g, label).await?;
        if done >= nodes || started.elapsed() >= window {
            break;
        }
        for (i, c) in children.iter_mut().enumerate() {
            if let Some(status) = c.0.try_wait()? {
                bail!("{what} {i} exited ({status}) after {done} of {nodes} nodes");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (delivered, span_ms) = acknowledged(g, label).await?;
    ensure!(delivered > 0, "{what}: nothing delivered within {window:?}");
    Ok(Drain {
        delivered,
        per_s: delivered as f64 / (span_ms.max(1) as f64 / 1e3),
    })
}

/// `n` of the vault's dispatchers (its defaults) drain a fresh backlog.
async fn run_dispatchers(a: &Args, uri: &str, n: usize, target: &str) -> anyhow::Result<Drain> {
    let label = unique("Vault");
    let outbox = indexes(uri, &label).await?;
    fill_vault_backlog(outbox.graph(), &label, a.vault_nodes, a.vault_packets).await?;
    let script = repo().join("tests/vault/vault.mjs");
    ensure!(
        repo()
            .join("tests/vault/node_modules/neo4j-driver")
            .exists(),
        "tests/vault/node_modules is missing: run scripts/setup.sh (npm ci --prefix tests/vault)"
    );
    let dir = tempfile::tempdir()?;
    let mut children = Vec::new();
    for i in 0..n {
        let log = std::fs::File::create(dir.path().join(format!("dispatcher{i}.log")))?;
        let child = Command::new("node")
            .arg(&script)
            .args([
                "dispatch", "--url", uri, "--label", &label, "--target", target,
            ])
            .args(["--secret", "bench", "--worker", &format!("vault-{i}")])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("run node tests/vault/vault.mjs")?;
        children.push(Killed(child));
    }
    let result = drain(
        outbox.graph(),
        &label,
        a.vault_nodes,
        a.vault_window,
        &mut children,
        "dispatcher",
    )
    .await;
    drop(children);
    delete_label(outbox.graph(), &label).await;
    result
}

/// `n` outboxd processes with `deploy/vault/` drain a fresh backlog into
/// the receiver through the `awareness` sink.
async fn run_vault_relays(
    a: &Args,
    bin: &Path,
    uri: &str,
    n: usize,
    target: &str,
) -> anyhow::Result<Drain> {
    let label = unique("Vault");
    let outbox = indexes(uri, &label).await?;
    fill_vault_backlog(outbox.graph(), &label, a.vault_nodes, a.vault_packets).await?;
    let (db, url) = new_db(&format!("v{n}")).await?;
    let dir = tempfile::tempdir()?;
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins)?;
    let wasm = repo().join("target/plugins/awareness.wasm");
    ensure!(
        wasm.exists(),
        "{} is missing: run scripts/build-plugins.sh",
        wasm.display()
    );
    std::fs::copy(&wasm, plugins.join("awareness.wasm"))?;
    std::fs::copy(
        repo().join("deploy/vault/awareness.toml"),
        plugins.join("awareness.toml"),
    )?;
    let mut children = Vec::new();
    for i in 0..n {
        let log = std::fs::File::create(dir.path().join(format!("relay{i}.log")))?;
        let child = Command::new(bin)
            .arg("run")
            .env("OUTBOXD_CONFIG", repo().join("deploy/vault/outboxd.toml"))
            .env("OUTBOXD_DATABASE_URL", &url)
            .env("OUTBOXD_LISTEN", format!("127.0.0.1:{}", free_port()))
            .env("OUTBOXD_PLUGINS_DIR", &plugins)
            .env("OUTBOXD_DATA_DIR", dir.path().join(format!("data{i}")))
            .env("OUTBOXD_SOURCES__VAULT__URL", uri)
            .env("OUTBOXD_SOURCES__VAULT__LABEL", &label)
            .env("VAULT_NEO4J_PASSWORD", "")
            .env("OUTBOXD_AWARENESS_URL", target)
            .env("OUTBOXD_AWARENESS_ALLOW", target)
            .env("OUTBOXD_AWARENESS_INGEST_SECRET", "bench")
            .env(
                "RUST_LOG",
                std::env::var("BENCH_OUTBOXD_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("run {}", bin.display()))?;
        children.push(Killed(child));
    }
    let result = drain(
        outbox.graph(),
        &label,
        a.vault_nodes,
        a.vault_window,
        &mut children,
        "relay",
    )
    .await;
    drop(children);
    for i in 0..n {
        let trouble = log_trouble(dir.path(), i, 5);
        if !trouble.is_empty() {
            eprintln!(
                "neo4j_bench: vault relay {i} of {n} logged (first {}):\n{}",
                trouble.len(),
                trouble.join("\n")
            );
        }
    }
    drop_db(&db).await;
    delete_label(outbox.graph(), &label).await;
    result
}

/// The takeover comparison: the vault's dispatchers against outboxd's
/// relays doing the same safe work on the same backlog shape.
async fn takeover(a: &Args, bin: &Path, uri: &str) -> anyhow::Result<()> {
    let (target, posts) = ingest_receiver().await?;
    let mut rows = Vec::new();
    let mut rate = std::collections::BTreeMap::new();
    for &d in &a.dispatchers {
        let run = run_dispatchers(a, uri, d, &target).await?;
        eprintln!(
            "neo4j_bench: {d} vault dispatcher(s): {:.0} nodes/s ({} delivered)",
            run.per_s, run.delivered
        );
        rate.insert(format!("dispatchers_{d}"), run.per_s);
        rows.push(json!({"side": "vault dispatcher", "processes": d, "delivered_per_s": run.per_s.round(), "delivered": run.delivered}));
    }
    for &r in &a.relays {
        let run = run_vault_relays(a, bin, uri, r, &target).await?;
        eprintln!(
            "neo4j_bench: {r} outboxd relay(s), deploy/vault: {:.0} nodes/s ({} delivered)",
            run.per_s, run.delivered
        );
        rate.insert(format!("relays_{r}"), run.per_s);
        rows.push(json!({"side": "outboxd", "processes": r, "delivered_per_s": run.per_s.round(), "delivered": run.delivered}));
    }
    let vs = |r: usize, d: usize| match (
        rate.get(&format!("relays_{r}")),
        rate.get(&format!("dispatchers_{d}")),
    ) {
        (Some(o), Some(v)) => Some(ratio(*o, *v)),
        _ => None,
    };
    println!(
        "{}",
        json!({
            "stage": "takeover",
            "nodes": a.vault_nodes,
            "packets": a.vault_packets,
            "window_s": a.vault_window.as_secs(),
            "runs": rows,
            "posts": posts.load(std::sync::atomic::Ordering::Relaxed),
            "relays_1_vs_dispatchers_1": vs(1, 1),
            "relays_3_vs_dispatchers_3": vs(3, 3),
        })
    );
    Ok(())
}
