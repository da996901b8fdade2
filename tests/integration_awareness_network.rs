//! The awareness network on outboxd, end to end and all real: vault-shaped
//! outbox nodes written to Neo4j with the documented Cypher → outboxd A
//! (Neo4j relay → `awareness` sink) → outboxd B (the awareness-compatible
//! `POST /ingest` → one webhook destination per platform, awareness
//! payload, kept by a platform sync) → three platform receivers that verify
//! `x-aaas-signature` as a receiver of the awareness service does. A and B
//! are SIGKILLed three times each while it runs.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use common::neo4j::Neo4jServer;
use common::{Backend, ChildConfig, ChildDaemon, PluginsDir, Receiver, TestDb};
use neo4rs::query;
use serde_json::{json, Value};

const PACKETS: usize = 50;
const PER_PACKET: usize = 40;
const KILLS_EACH: usize = 3;
const INGEST_SECRET: &str = "network-ingest-secret";
const PLATFORMS: [&str; 3] = ["alpha", "beta", "gamma"];

fn documented_cypher(doc: &str, marker: &str) -> String {
    let doc = std::fs::read_to_string(common::repo_root().join(doc)).unwrap();
    let after = doc
        .split(marker)
        .nth(1)
        .unwrap_or_else(|| panic!("{doc} has no {marker}"));
    let block = after.split("```cypher\n").nth(1).unwrap();
    block.split("\n```").next().unwrap().to_string()
}

/// `x-aaas-signature` checked as a receiver of the awareness service
/// checks it: lowercase hex HMAC-SHA256 of the raw body, keyed with the
/// secret's bytes, compared in constant time.
fn signature_valid(secret: &str, body: &[u8], header: Option<String>) -> bool {
    use hmac::{Hmac, Mac};
    let Some(given) = header else { return false };
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    let expected = hex::encode(mac.finalize().into_bytes());
    common::constant_time_eq(expected.as_bytes(), given.as_bytes())
}

/// Who sent mutation `k` of a packet: cycling through the platforms and
/// "nobody".
fn sender(k: usize) -> Option<&'static str> {
    match k % 4 {
        3 => None,
        i => Some(PLATFORMS[i]),
    }
}

fn child(
    name: &str,
    data: &std::path::Path,
    listen: std::net::SocketAddr,
    db: &TestDb,
    plugins: &PluginsDir,
    env: &[(&str, String)],
) -> ChildConfig {
    let data = data.join(name);
    let mut all = vec![
        ("OUTBOXD_DELIVERY__LEASE".to_string(), "12s".to_string()),
        (
            "OUTBOXD_DELIVERY__MAX_POLL_INTERVAL".to_string(),
            "200ms".to_string(),
        ),
    ];
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
    ChildConfig {
        listen,
        database_url: db.url.clone(),
        plugins_dir: plugins.path().to_path_buf(),
        data_dir: data,
        env: all,
        log: common::child_log(&format!("awareness-network-{name}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vaults_to_platforms_through_two_outboxd_sigkilled_every_event_once_in_order_never_echoed()
{
    common::init_logs();
    let neo4j = Neo4jServer::shared();
    let graph = neo4j.graph();
    graph
        .run(query(&documented_cypher(
            "docs/neo4j.md",
            "<!-- neo4j-schema -->",
        )))
        .await
        .unwrap();
    let write = documented_cypher("docs/awareness.md", "<!-- awareness-outbox-write -->");

    // The platforms.
    let receivers = [
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    ];
    let secrets: Vec<String> = PLATFORMS
        .iter()
        .map(|p| format!("{p}-webhook-secret"))
        .collect();

    // outboxd B: the awareness ingest, one destination per platform.
    // Each daemon's data folder (its compiled-plugin cache), removed
    // with the test.
    let data = tempfile::tempdir().unwrap();
    let (db_a, db_b) = (
        TestDb::new(Backend::Postgres).await,
        TestDb::new(Backend::Postgres).await,
    );
    let plugins_b = PluginsDir::new();
    let allow: Vec<String> = receivers.iter().map(|r| r.origin()).collect();
    plugins_b.add_webhook_with_limits(
        "webhook",
        &receivers[0].url(),
        &allow,
        &common::new_secret(),
        "deadline = \"3s\"\nmax-batch = 50\n",
        "",
    );
    let listen_b = common::free_loopback_addr();
    let config_b = child(
        "b",
        data.path(),
        listen_b,
        &db_b,
        &plugins_b,
        &[(
            "OUTBOXD_INGEST__AWARENESS__SECRET",
            INGEST_SECRET.to_string(),
        )],
    );
    let mut b = ChildDaemon::spawn(&config_b);
    b.wait_healthy(Duration::from_secs(60)).await;
    let http = reqwest::Client::new();
    let platforms: Vec<Value> = PLATFORMS
        .iter()
        .zip(&receivers)
        .zip(&secrets)
        .map(|((name, r), secret)| json!({ "name": name, "url": r.url(), "secret": secret }))
        .collect();
    let synced: Value = http
        .post(format!("{}/v1/admin/destinations/sync", b.base))
        .json(&json!({ "platforms": platforms, "config": { "payload": "awareness" } }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(synced["created"], json!(PLATFORMS), "{synced}");

    // outboxd A: the Neo4j relay → the awareness sink posting to B.
    let plugins_a = PluginsDir::new();
    std::fs::copy(
        common::built_plugins().join("awareness.wasm"),
        plugins_a.path().join("awareness.wasm"),
    )
    .unwrap();
    std::fs::write(
        plugins_a.path().join("awareness.toml"),
        format!(
            "name = \"awareness\"\nversion = \"0.1.0\"\ncomponent = \"awareness.wasm\"\nwit = \"outboxd:sink@0.1.0\"\n\
             [limits]\ndeadline = \"3s\"\nmax-batch = 50\n[capabilities]\nhttp = [\"http://{listen_b}\"]\n\
             [retry]\nbase = \"100ms\"\ncap = \"1s\"\n\
             [config]\nurl = \"http://{listen_b}\"\nsecret = \"{INGEST_SECRET}\"\n"
        ),
    )
    .unwrap();
    let listen_a = common::free_loopback_addr();
    let config_a = child(
        "a",
        data.path(),
        listen_a,
        &db_a,
        &plugins_a,
        &[
            ("OUTBOXD_SOURCES__VAULT__KIND", "neo4j".into()),
            ("OUTBOXD_SOURCES__VAULT__URL", neo4j.uri.clone()),
            ("OUTBOXD_SOURCES__VAULT__LEASE", "5s".into()),
            ("OUTBOXD_SOURCES__VAULT__TIMEOUT", "2s".into()),
            ("OUTBOXD_SOURCES__VAULT__POLL_INTERVAL", "100ms".into()),
            ("OUTBOXD_SOURCES__VAULT__RETRY_BASE", "200ms".into()),
            ("OUTBOXD_SOURCES__VAULT__RETRY_CAP", "1s".into()),
        ],
    );
    let mut a = ChildDaemon::spawn(&config_a);
    a.wait_healthy(Duration::from_secs(60)).await;

    // The vaults: per packet, mutations one after another, each in a
    // transaction of its own with a mutation and the documented outbox
    // write; packets concurrently. Data goes A → B → A → … on each packet.
    let writers: Vec<_> = (0..PACKETS)
        .map(|p| {
            let (graph, write) = (graph.clone(), write.clone());
            tokio::spawn(async move {
                let packet = format!("packet-{p:02}");
                for k in 0..PER_PACKET {
                    let state = if k % 2 == 0 { "A" } else { "B" };
                    let mut txn = graph.start_txn().await.unwrap();
                    txn.run(
                        query("MERGE (m:MetaEnvelope {id: $p}) SET m.state = $s")
                            .param("p", packet.clone())
                            .param("s", state),
                    )
                    .await
                    .unwrap();
                    let q = query(&write)
                        .param("packetId", packet.clone())
                        .param("eventId", format!("{packet}-m{k:03}"))
                        .param("eventType", "w3ds.metaenvelope.updated")
                        .param(
                            "payload",
                            json!({ "packet": packet, "k": k, "state": state }).to_string(),
                        )
                        .param("w3id", format!("@user-{p}"))
                        .param("evaultPublicKey", "z6Mk-test-key")
                        .param("schemaId", "550e8400-e29b-41d4-a716-446655440000")
                        .param("operation", if k == 0 { "create" } else { "update" });
                    let q = match sender(k) {
                        Some(s) => q.param("requestingPlatform", s),
                        None => q.param(
                            "requestingPlatform",
                            neo4rs::BoltType::Null(neo4rs::BoltNull),
                        ),
                    };
                    txn.run(q).await.unwrap();
                    txn.commit().await.unwrap();
                }
            })
        })
        .collect();

    // Expected per platform: every mutation its platform did not send, in
    // packet order.
    let expected: Vec<BTreeMap<String, Vec<usize>>> = PLATFORMS
        .iter()
        .map(|platform| {
            (0..PACKETS)
                .map(|p| {
                    let ks = (0..PER_PACKET)
                        .filter(|k| sender(*k) != Some(*platform))
                        .collect();
                    (format!("packet-{p:02}"), ks)
                })
                .collect()
        })
        .collect();
    let totals: Vec<usize> = expected
        .iter()
        .map(|e| e.values().map(Vec::len).sum())
        .collect();
    let unique = |r: &Receiver| {
        r.with_seen(|seen| {
            seen.iter()
                .filter_map(|x| x.header("x-aaas-event-id"))
                .collect::<HashSet<_>>()
                .len()
        })
    };
    let start = Instant::now();
    let (mut kills_a, mut kills_b) = (0, 0);
    // Kills that landed while deliveries were still missing, per process.
    let (mut mid_a, mut mid_b) = (0, 0);
    loop {
        let done = receivers.iter().zip(&totals).all(|(r, t)| unique(r) >= *t);
        if done && kills_a >= KILLS_EACH && kills_b >= KILLS_EACH {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(420),
            "after {kills_a}+{kills_b} kills: {:?} of {totals:?}\nA:\n{}\nB:\n{}",
            receivers.iter().map(&unique).collect::<Vec<_>>(),
            a.log_tail(20),
            b.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let incomplete = receivers.iter().zip(&totals).any(|(r, t)| unique(r) < *t);
        if kills_a < KILLS_EACH && kills_a <= kills_b {
            mid_a += incomplete as usize;
            a.kill();
            kills_a += 1;
            a = ChildDaemon::spawn(&config_a);
            a.wait_healthy(Duration::from_secs(60)).await;
        } else if kills_b < KILLS_EACH {
            mid_b += incomplete as usize;
            b.kill();
            kills_b += 1;
            b = ChildDaemon::spawn(&config_b);
            b.wait_healthy(Duration::from_secs(60)).await;
        }
    }
    for w in writers {
        w.await.unwrap();
    }
    assert!(
        mid_a >= 1 && mid_b >= 1,
        "the kills did not land mid-run (A {mid_a}, B {mid_b} of {KILLS_EACH} each)"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut redelivered = 0;
    for (i, r) in receivers.iter().enumerate() {
        let platform = PLATFORMS[i];
        let mut firsts: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut seen = HashSet::new();
        r.with_seen(|all| {
            for x in all {
                assert!(
                    signature_valid(&secrets[i], &x.body, x.header("x-aaas-signature")),
                    "{platform}: a request whose x-aaas-signature does not verify"
                );
                let body: Value = serde_json::from_slice(&x.body).unwrap();
                let id = x.header("x-aaas-event-id").unwrap();
                assert_eq!(body["eventId"], id.as_str());
                // The awareness service's key order, as its receivers see it.
                let raw = String::from_utf8_lossy(&x.body);
                let at: Vec<usize> = [
                    "{\"eventId\":",
                    ",\"id\":",
                    ",\"w3id\":",
                    ",\"evaultPublicKey\":",
                    ",\"data\":",
                    ",\"schemaId\":",
                    ",\"operation\":",
                ]
                .iter()
                .map(|k| {
                    raw.find(k)
                        .unwrap_or_else(|| panic!("{k} missing in {raw}"))
                })
                .collect();
                assert!(
                    at[0] == 0 && at.windows(2).all(|w| w[0] < w[1]),
                    "key order: {raw}"
                );
                assert_eq!(body.as_object().unwrap().len(), 7, "{raw}");
                if seen.insert(id) {
                    let packet = body["id"].as_str().unwrap().to_string();
                    let k = body["data"]["k"].as_u64().unwrap() as usize;
                    assert_ne!(
                        sender(k),
                        Some(platform),
                        "{platform} got an event it sent itself: {body}"
                    );
                    assert_eq!(body["data"]["state"], if k % 2 == 0 { "A" } else { "B" });
                    firsts.entry(packet).or_default().push(k);
                } else {
                    redelivered += 1;
                }
            }
        });
        assert_eq!(
            firsts, expected[i],
            "{platform}: not every event once, in packet order"
        );
    }
    eprintln!(
        "awareness network: {} mutations, {kills_a} + {kills_b} SIGKILLs ({mid_a} + {mid_b} mid-run), {redelivered} re-deliveries, {:.1}s",
        PACKETS * PER_PACKET,
        start.elapsed().as_secs_f64()
    );
    drop(a);
    drop(b);
    db_a.cleanup().await;
    db_b.cleanup().await;
}
