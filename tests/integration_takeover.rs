//! Taking over a running vault's awareness outbox, in the vault's own
//! words, mid-flight and back, with the deploy files of `deploy/vault/`.
//!
//! The vault side is `tests/vault/vault.mjs` on the official JavaScript
//! driver: its outbox write (so every property has the type the vault's
//! code gives it: `Date.now()` a FLOAT, the time ISO text, the data JSON
//! text) and a dispatcher written from the vault's published protocol
//! (lock-first lease with `claimProbe`, predecessor check, fenced finish
//! on `{eventId, leaseToken}`, retries, no dead state). The target is a
//! receiver of the awareness service's `POST /ingest` on loopback.
//!
//! One run goes through every hand-over: the vault's dispatcher alone,
//! then stopped holding leases; outboxd alone, SIGKILLed three times;
//! both side by side, outboxd SIGKILLed three more times; outboxd
//! SIGKILLed for good and the dispatcher alone again (handing back) — while
//! the vault keeps writing. Then every event has reached the target,
//! the first arrivals of each packet in version order, nothing is left
//! undelivered, every node reads as the vault's own code expects, and no
//! bookkeeping property of the vault became part of an event.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::neo4j::{unique_label, Neo4jServer};
use common::{Backend, ChildConfig, ChildDaemon, PluginsDir, Receiver, TestDb};
use neo4rs::query;
use outboxd::sources::neo4j::{Neo4jSourceConfig, Outbox};
use outboxd::sources::SourceConfig;
use serde_json::Value;

const PACKETS: usize = 30;
const PER_PACKET: usize = 24;
const KILLS_ALONE: usize = 3;
const KILLS_SIDE_BY_SIDE: usize = 3;
const SECRET: &str = "vault-ingest-secret";

/// `tests/vault`, its `node_modules` installed (`npm ci`, once).
fn vault_programs() -> PathBuf {
    let dir = common::repo_root().join("tests/vault");
    if !dir.join("node_modules/neo4j-driver").exists() {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .status()
            .expect("run npm ci in tests/vault (Node 20 and npm are needed)");
        assert!(status.success(), "npm ci in tests/vault failed");
    }
    dir
}

/// A child process killed when dropped, so that a failing test leaves no
/// vault program behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The tests of this file one at a time: each drives the shared Neo4j hard
/// and times its phases.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `node vault.mjs ARGS`, its output appended to `log`.
fn vault(args: &[&str], log: &std::path::Path) -> Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new("node")
        .arg(vault_programs().join("vault.mjs"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start node")
}

/// The vault's dispatcher with the test's short lease and retry schedule.
fn dispatcher(
    neo4j: &str,
    label: &str,
    target: &str,
    worker: &str,
    log: &std::path::Path,
) -> Killed {
    Killed(vault(
        &[
            "dispatch",
            "--url",
            neo4j,
            "--label",
            label,
            "--target",
            target,
            "--secret",
            SECRET,
            "--worker",
            worker,
            "--lease-ms",
            "3000",
            "--poll-ms",
            "100",
            "--batch",
            "20",
            "--retry-ms",
            "200,400,800",
        ],
        log,
    ))
}

/// Answers scripted for the receiver; later requests get 200.
const ANSWERS: usize = 4000;

/// Whether the receiver refuses its `i`-th request (503).
fn refused(i: usize) -> bool {
    i < ANSWERS && i % 7 == 3
}

/// `(eventId, packet, streamVersion)` of every request the receiver
/// acknowledged, in arrival order (a refused one does not count: it is sent
/// again).
fn arrivals(receiver: &Receiver) -> Vec<(String, String, i64)> {
    receiver.with_seen(|seen| {
        seen.iter()
            .enumerate()
            .filter(|(i, _)| !refused(*i))
            .filter_map(|(_, r)| {
                let body: Value = serde_json::from_slice(&r.body).ok()?;
                Some((
                    body["eventId"].as_str()?.to_string(),
                    body["id"].as_str()?.to_string(),
                    body["streamVersion"].as_i64()?,
                ))
            })
            .collect()
    })
}

async fn count(graph: &neo4rs::Graph, label: &str, condition: &str) -> i64 {
    let mut rows = graph
        .execute(query(&format!(
            "MATCH (a:`{label}`) WHERE {condition} RETURN count(a) AS n"
        )))
        .await
        .unwrap();
    rows.next().await.unwrap().unwrap().get("n").unwrap()
}

/// Wait until `n` more nodes are delivered than now (60 s at most).
async fn progress(graph: &neo4rs::Graph, label: &str, n: i64) {
    let delivered = "a.status = 'delivered'";
    let from = count(graph, label, delivered).await;
    let start = Instant::now();
    while count(graph, label, delivered).await < from + n {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no progress: {} delivered",
            count(graph, label, delivered).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The daemon's configuration; `data` is its data folder, whose last
/// component names its log.
fn outboxd(
    data: &std::path::Path,
    db: &TestDb,
    plugins: &PluginsDir,
    listen: std::net::SocketAddr,
    neo4j: &str,
    label: &str,
    receiver: &Receiver,
) -> ChildConfig {
    let name = data
        .file_name()
        .map_or("a".into(), |n| n.to_string_lossy().into_owned());
    let env: Vec<(&str, String)> = vec![
        (
            "OUTBOXD_CONFIG",
            common::repo_root()
                .join("deploy/vault/outboxd.toml")
                .display()
                .to_string(),
        ),
        ("OUTBOXD_SOURCES__VAULT__URL", neo4j.to_string()),
        ("OUTBOXD_SOURCES__VAULT__LABEL", label.to_string()),
        ("OUTBOXD_SOURCES__VAULT__LEASE", "11s".into()),
        ("OUTBOXD_SOURCES__VAULT__TIMEOUT", "5s".into()),
        ("OUTBOXD_SOURCES__VAULT__POLL_INTERVAL", "100ms".into()),
        ("OUTBOXD_SOURCES__VAULT__RETRY_BASE", "200ms".into()),
        ("OUTBOXD_SOURCES__VAULT__RETRY_CAP", "1s".into()),
        ("VAULT_NEO4J_PASSWORD", String::new()),
        ("OUTBOXD_AWARENESS_URL", receiver.origin()),
        ("OUTBOXD_AWARENESS_ALLOW", receiver.origin()),
        ("OUTBOXD_AWARENESS_INGEST_SECRET", SECRET.into()),
        ("OUTBOXD_DELIVERY__LEASE", "9s".into()),
        ("OUTBOXD_DELIVERY__MAX_POLL_INTERVAL", "200ms".into()),
    ];
    ChildConfig {
        listen,
        database_url: db.url.clone(),
        plugins_dir: plugins.path().to_path_buf(),
        data_dir: data.to_path_buf(),
        env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        log: common::child_log(&format!("takeover-{name}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_vault_is_taken_over_mid_flight_and_handed_back_losing_nothing() {
    common::init_logs();
    let _one = ONE_AT_A_TIME.lock().await;
    let neo4j = Neo4jServer::shared();
    let graph = neo4j.graph();
    let label = unique_label();
    let vault_log = common::child_log("takeover-vault");

    // The awareness service: refuses one post in seven, whoever sends it,
    // so that events wait for a retry in every phase.
    let receiver = Receiver::start().await;
    for i in 0..ANSWERS {
        match refused(i) {
            true => receiver.script(503, &[], "{\"error\":\"busy\"}"),
            false => receiver.script(200, &[], "{\"ok\":true}"),
        }
    }
    let target = receiver.origin();

    // The vault keeps writing through every phase.
    let mut writer = Killed(vault(
        &[
            "write",
            "--url",
            &neo4j.uri,
            "--label",
            &label,
            "--packets",
            &PACKETS.to_string(),
            "--per-packet",
            &PER_PACKET.to_string(),
            "--pause-ms",
            "600",
        ],
        &vault_log,
    ));

    // 1. The vault's dispatcher alone; then stopped while holding leases:
    //    killed mid-cycle, and one more that leases a batch and exits.
    let first = dispatcher(&neo4j.uri, &label, &target, "vault-a", &vault_log);
    let start = Instant::now();
    while count(&graph, &label, "a.status = 'delivered'").await < 40 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the vault's dispatcher delivers nothing; see {}",
            vault_log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(first);
    let held = vault(
        &[
            "dispatch",
            "--url",
            &neo4j.uri,
            "--label",
            &label,
            "--target",
            &target,
            "--worker",
            "vault-held",
            "--lease-ms",
            "8000",
            "--batch",
            "20",
            "--hold",
        ],
        &vault_log,
    )
    .wait_with_output()
    .unwrap();
    assert!(held.status.success());
    let holding = count(&graph, &label, "a.status = 'delivering'").await;
    assert!(holding > 0, "the stopped dispatcher holds no lease");

    // 2. outboxd alone, with the deploy files, SIGKILLed three times.
    let db = TestDb::new(Backend::Sqlite).await;
    let plugins = PluginsDir::new();
    std::fs::copy(
        common::built_plugins().join("awareness.wasm"),
        plugins.path().join("awareness.wasm"),
    )
    .unwrap();
    // The deployed manifest with the test's short deadline (the daemon's
    // delivery lease must outlast two deadlines, and a SIGKILLed daemon's
    // deliveries come back when their lease runs out).
    let manifest =
        std::fs::read_to_string(common::repo_root().join("deploy/vault/awareness.toml")).unwrap();
    assert!(manifest.contains("deadline = \"30s\""), "{manifest}");
    std::fs::write(
        plugins.path().join("awareness.toml"),
        manifest.replace("deadline = \"30s\"", "deadline = \"2s\""),
    )
    .unwrap();
    let listen = common::free_loopback_addr();
    let data = tempfile::tempdir().unwrap();
    let config = outboxd(
        &data.path().join("a"),
        &db,
        &plugins,
        listen,
        &neo4j.uri,
        &label,
        &receiver,
    );
    let mut daemon = ChildDaemon::spawn(&config);
    daemon.wait_healthy(Duration::from_secs(60)).await;
    for _ in 0..KILLS_ALONE {
        progress(&graph, &label, 10).await;
        daemon.kill();
        daemon = ChildDaemon::spawn(&config);
        daemon.wait_healthy(Duration::from_secs(60)).await;
    }

    // 3. Side by side: the vault's dispatcher back while outboxd runs,
    //    outboxd SIGKILLed three more times.
    let second = dispatcher(&neo4j.uri, &label, &target, "vault-b", &vault_log);
    for _ in 0..KILLS_SIDE_BY_SIDE {
        progress(&graph, &label, 10).await;
        daemon.kill();
        daemon = ChildDaemon::spawn(&config);
        daemon.wait_healthy(Duration::from_secs(60)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 4. Handing back: outboxd stopped mid-flight for good; the vault's
    //    dispatcher finishes what is left, outboxd's leases included.
    daemon.kill();
    let status = writer.0.wait().unwrap();
    assert!(
        status.success(),
        "the vault's writer failed: see {}",
        vault_log.display()
    );
    let total = (PACKETS * PER_PACKET) as i64;
    let start = Instant::now();
    while count(&graph, &label, "a.status = 'delivered'").await < total {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "not all delivered: {} of {total}; see {}",
            count(&graph, &label, "a.status = 'delivered'").await,
            vault_log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(second);

    // Every event reached the target; per packet, the first arrival of each
    // version came after the first arrival of the one before.
    let seen = arrivals(&receiver);
    let mut first_seen: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for (id, packet, version) in &seen {
        if ids.insert(id.clone()) {
            first_seen.entry(packet.clone()).or_default().push(*version);
        }
    }
    if ids.len() as i64 != total {
        let all: Vec<(usize, String, Option<String>)> = receiver.with_seen(|seen| {
            seen.iter()
                .enumerate()
                .map(|(i, r)| {
                    let body: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                    (
                        i,
                        body["eventId"].as_str().unwrap_or("?").to_string(),
                        r.header("user-agent"),
                    )
                })
                .collect()
        });
        let mut missing = 0;
        for k in 0..PER_PACKET {
            for p in 0..PACKETS {
                let id = format!("packet-{p:04}-{k:05}");
                if ids.contains(&id) || missing >= 6 {
                    continue;
                }
                missing += 1;
                let posts: Vec<String> = all
                    .iter()
                    .filter(|(_, e, _)| *e == id)
                    .map(|(i, _, ua)| format!("#{i} refused={} ua={ua:?}", refused(*i)))
                    .collect();
                let mut rows = graph
                    .execute(
                        query(&format!(
                            "MATCH (a:`{label}` {{eventId: $id}}) RETURN properties(a) AS p"
                        ))
                        .param("id", id.clone()),
                    )
                    .await
                    .unwrap();
                let props = rows
                    .next()
                    .await
                    .unwrap()
                    .map(|r| format!("{:?}", r.get::<neo4rs::BoltMap>("p")));
                eprintln!("missing {id}: posts {posts:?}; node {props:?}");
            }
        }
    }
    assert_eq!(ids.len() as i64, total, "events that reached the target");
    for (packet, versions) in &first_seen {
        let expected: Vec<i64> = (1..=PER_PACKET as i64).collect();
        assert_eq!(versions, &expected, "first arrivals of {packet}");
    }

    // The vault's view: every node as its own code leaves a delivered one.
    for (what, condition) in [
        ("not delivered", "a.status <> 'delivered'"),
        ("acknowledgedAt not epoch ms (FLOAT)", "NOT a.acknowledgedAt IS :: FLOAT NOT NULL"),
        ("createdAt changed type", "NOT a.createdAt IS :: FLOAT NOT NULL"),
        ("nextAttemptAt not a number", "NOT (a.nextAttemptAt IS :: FLOAT NOT NULL OR a.nextAttemptAt IS :: INTEGER NOT NULL)"),
        ("a lease left", "a.leaseToken IS NOT NULL OR a.leaseOwner IS NOT NULL OR a.leaseExpiresAt IS NOT NULL"),
        ("a lastError left", "a.lastError IS NOT NULL"),
        ("acknowledged before created", "a.acknowledgedAt < a.createdAt"),
        ("attempts not a number", "NOT (a.attempts IS :: INTEGER NOT NULL OR a.attempts IS :: FLOAT NOT NULL) OR a.attempts < 1"),
        ("outboxd's own property", "a.outboxdClaimLock IS NOT NULL OR a.deliveredAt IS NOT NULL OR a.eventType IS NOT NULL"),
    ] {
        assert_eq!(count(&graph, &label, condition).await, 0, "nodes with {what}");
    }

    // What outboxd stored as events: the vault's words made a CloudEvent,
    // none of its bookkeeping among the extension attributes.
    let store = outboxd::store::open(&db.url).await.unwrap();
    let allowed: BTreeSet<&str> = [
        "w3id",
        "evaultpublickey",
        "schemaid",
        "operation",
        "requestingplatform",
    ]
    .into();
    let mut relayed = 0;
    for id in &ids {
        let Some(stored) = store.stored_event(id).await.unwrap() else {
            continue; // delivered by the vault's dispatcher alone
        };
        relayed += 1;
        let ev = stored.event;
        let keys: BTreeSet<&str> = ev.extensions.keys().map(|k| k.as_str()).collect();
        assert!(
            keys.is_subset(&allowed),
            "event {id} has extensions {keys:?}"
        );
        assert!(
            keys.contains("schemaid") && keys.contains("w3id"),
            "{keys:?}"
        );
        let op = &ev.extensions["operation"];
        assert_eq!(ev.ty, format!("w3ds.metaenvelope.{op}"));
        assert!(
            ev.time.as_deref().is_some_and(|t| t.ends_with('Z')),
            "{:?}",
            ev.time
        );
        let data: Value = serde_json::from_slice(&ev.data).unwrap();
        assert_eq!(data["packet"].as_str(), Some(ev.stream.as_str()));
    }
    assert!(relayed > 0, "outboxd relayed no event");
}

/// The source `vault` of `deploy/vault/outboxd.toml`, on `label` at `uri`,
/// with the test's short lease and waits.
fn deployed_vault_config(uri: &str, label: &str) -> Neo4jSourceConfig {
    let config = outboxd::config::Config::load(
        Some(&common::repo_root().join("deploy/vault/outboxd.toml")),
        serde_json::json!({}),
    )
    .unwrap();
    let Some(SourceConfig::Neo4j(mut c)) = config.sources.get("vault").cloned() else {
        panic!("deploy/vault/outboxd.toml has no neo4j source `vault`");
    };
    c.url = uri.to_string();
    c.label = label.to_string();
    c.lease = Duration::from_secs(45);
    c.timeout = Duration::from_secs(20);
    c.unreadable_lease_wait = Duration::from_secs(10);
    c
}

/// Nodes written by the vault's own code, in the states its dispatcher
/// leaves them, read in the vault's words: a failed node keeps its
/// epoch-millisecond backoff, a `delivering` node blocks its packet until
/// its lease (epoch ms) runs out, one whose lease cannot be read is waited
/// out, a time in another encoding and a status that is none of the words
/// are reported with the node and the property and never relayed.
#[tokio::test]
async fn vault_nodes_in_every_state_the_dispatcher_leaves_are_read_in_its_words() {
    common::init_logs();
    let _one = ONE_AT_A_TIME.lock().await;
    let neo4j = Neo4jServer::shared();
    let graph = neo4j.graph();
    let label = unique_label();
    let log = common::child_log("takeover-states");
    let written = vault(
        &[
            "write",
            "--url",
            &neo4j.uri,
            "--label",
            &label,
            "--packets",
            "6",
            "--per-packet",
            "2",
        ],
        &log,
    )
    .wait()
    .unwrap();
    assert!(written.success(), "see {}", log.display());
    let id = |p: usize, k: usize| format!("packet-{p:04}-{k:05}");
    // The relay, its query plans made once (read-only: nothing is claimed).
    let c = deployed_vault_config(&neo4j.uri, &label);
    let outbox = Outbox::connect(&c, "").unwrap();
    outbox.ensure_indexes().await.unwrap();
    outbox.shortlist(20).await.unwrap();
    let set = |id: String, map: &str| {
        let graph = graph.clone();
        let text = format!("MATCH (a:`{label}` {{eventId: $id}}) SET a += {map}");
        async move { graph.run(query(&text).param("id", id)).await.unwrap() }
    };
    let now_ms = "toFloat(datetime().epochMillis)";
    // packet 0: failed, due in an hour (the vault's backoff).
    set(id(0, 0), &format!("{{status: 'failed', attempts: 3.0, nextAttemptAt: {now_ms} + 3600000.0, lastError: '503: starting'}}")).await;
    // packet 1: delivering under the vault's live lease.
    set(id(1, 0), &format!("{{status: 'delivering', leaseOwner: 'evault-7', leaseToken: 'vault-token', claimProbe: 'vault-token', leaseExpiresAt: {now_ms} + 3600000.0}}")).await;
    // packet 2: delivering, the lease run out a minute ago.
    set(id(2, 0), &format!("{{status: 'delivering', leaseOwner: 'evault-7', leaseToken: 'old-token', claimProbe: 'old-token', leaseExpiresAt: {now_ms} - 60000.0}}")).await;
    // packet 3: delivering, a lease expiry that is no number.
    set(id(3, 0), "{status: 'delivering', leaseOwner: 'evault-7', leaseToken: 'odd-token', leaseExpiresAt: 'soon'}").await;
    // packet 4: failed, its next attempt a Neo4j datetime (not epoch ms).
    set(id(4, 0), "{status: 'failed', nextAttemptAt: datetime()}").await;
    // packet 5: a status that is none of the vault's words.
    set(id(5, 0), "{status: 'queued'}").await;

    let claimed = outbox.claim(20).await.unwrap();
    let taken: BTreeSet<String> = claimed.iter().map(|n| n.event_id.clone()).collect();
    // Only the expired lease's node: every other packet's head is waiting
    // (backoff, a live lease, an unreadable lease, an unreadable time), and
    // nothing behind a head is taken; packet 5's second node is no head of
    // a live status either way — the unknown status does not block it.
    let expected: BTreeSet<String> = [id(2, 0), id(5, 1)].into();
    assert_eq!(taken, expected);
    let reclaimed: Vec<&str> = claimed
        .iter()
        .filter(|n| n.reclaimed)
        .map(|n| n.event_id.as_str())
        .collect();
    assert_eq!(reclaimed, vec![id(2, 0).as_str()]);
    // Written back in the vault's words: delivering, epoch-ms FLOAT expiry,
    // outboxd named as the lease owner, the lock property gone.
    let mut rows = graph
        .execute(
            query(&format!(
                "MATCH (a:`{label}` {{eventId: $id}}) RETURN a.status AS status, \
                 a.leaseExpiresAt IS :: FLOAT NOT NULL AS float_expiry, a.leaseOwner AS owner, \
                 a.claimProbe IS NULL AS probe_gone, a.attempts AS attempts"
            ))
            .param("id", id(2, 0)),
        )
        .await
        .unwrap();
    let row = rows.next().await.unwrap().unwrap();
    assert_eq!(row.get::<String>("status").unwrap(), "delivering");
    assert!(row.get::<bool>("float_expiry").unwrap());
    assert_eq!(row.get::<String>("owner").unwrap(), outbox.owner());
    assert!(row.get::<bool>("probe_gone").unwrap());
    assert_eq!(row.get::<i64>("attempts").unwrap(), 1);

    // Reported with the node and the property, once each, from the second
    // sighting on (one sighting can be a read racing a finish).
    outbox.shortlist(20).await.unwrap();
    outbox.sweep_unknown_statuses(100).await.unwrap();
    let mut reported: Vec<(String, String)> = outbox
        .take_malformed()
        .into_iter()
        .map(|m| (m.event_id, m.property))
        .collect();
    reported.sort();
    assert_eq!(
        reported,
        vec![
            (id(3, 0), "lease-expires-at".to_string()),
            (id(4, 0), "next-attempt-at".to_string()),
            (id(5, 0), "status".to_string()),
        ]
    );

    // Finished in the vault's words.
    let token = claimed[0].lease_token.clone();
    let done: Vec<String> = claimed.iter().map(|n| n.event_id.clone()).collect();
    assert_eq!(outbox.finish_delivered(&token, done).await.unwrap(), 2);
    assert_eq!(
        count(
            &graph,
            &label,
            "a.status = 'delivered' AND a.acknowledgedAt IS :: FLOAT NOT NULL \
             AND a.leaseOwner IS NULL AND a.leaseToken IS NULL AND a.leaseExpiresAt IS NULL"
        )
        .await,
        2
    );

    // The unreadable lease, once waited out, is taken over like an
    // expired one (with the next node of the packet just finished); the
    // others still wait.
    tokio::time::sleep(c.unreadable_lease_wait + Duration::from_millis(200)).await;
    let claimed = outbox.claim(20).await.unwrap();
    let taken: BTreeSet<String> = claimed.iter().map(|n| n.event_id.clone()).collect();
    assert_eq!(taken, [id(3, 0), id(2, 1)].into());
    let reclaimed: Vec<&str> = claimed
        .iter()
        .filter(|n| n.reclaimed)
        .map(|n| n.event_id.as_str())
        .collect();
    assert_eq!(reclaimed, vec![id(3, 0).as_str()]);
    assert!(outbox.take_malformed().is_empty(), "reported twice");
}
