//! The awareness-compatible `POST /ingest` end to end: the real `outboxd`
//! binary (a child process) with `[ingest.awareness]` configured from the
//! environment, on SQLite and on PostgreSQL, delivering through the
//! WebAssembly `webhook` sink to a real HTTP receiver on loopback.
//!
//! Each answer of the endpoint as the awareness service gives it: a good
//! body (200, the event readable with the mapped attributes, delivered), a
//! retry (200 duplicate, nothing queued or delivered twice), a reused
//! `eventId` with other content (409, nothing changed), bad bodies (400
//! naming the field, nothing stored), a missing or wrong secret (401,
//! nothing stored), A → B → A on one packet (three events, in order), and
//! `streamVersion` (kept as the sequence; a non-increasing one is 409).

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

/// The secret producers send, given to the child as `${AWARENESS_INGEST_SECRET}`.
const SECRET: &str = "test-ingest-secret-0123456789";

use common::both_stores;

both_stores!(
    a_good_body_is_stored_mapped_and_delivered_and_its_retry_is_a_duplicate,
    a_reused_event_id_with_other_content_is_409_and_changes_nothing,
    bad_bodies_are_400_naming_the_field_and_store_nothing,
    a_missing_or_wrong_secret_is_401_and_stores_nothing,
    a_b_a_on_one_packet_is_three_events_delivered_in_order,
    stream_versions_are_kept_and_a_non_increasing_one_is_409,
);

/// A child daemon with the awareness ingest on, a webhook sink to
/// `receiver`, on `db`.
struct Setup {
    daemon: ChildDaemon,
    http: reqwest::Client,
    _plugins: PluginsDir,
    _data: tempfile::TempDir,
}

impl Setup {
    async fn start(db: &TestDb, receiver: &Receiver, name: &str) -> Setup {
        Self::start_on(&db.url, receiver, name).await
    }

    async fn start_on(database_url: &str, receiver: &Receiver, name: &str) -> Setup {
        let plugins = PluginsDir::new();
        plugins.add_webhook_to("webhook", receiver);
        let data = tempfile::tempdir().unwrap();
        let config = ChildConfig {
            listen: free_loopback_addr(),
            database_url: database_url.to_string(),
            plugins_dir: plugins.path().to_path_buf(),
            data_dir: data.path().to_path_buf(),
            env: vec![
                (
                    "OUTBOXD_INGEST__AWARENESS__SECRET".into(),
                    "${AWARENESS_INGEST_SECRET}".into(),
                ),
                ("AWARENESS_INGEST_SECRET".into(), SECRET.into()),
                ("OUTBOXD_DELIVERY__MAX_POLL_INTERVAL".into(), "200ms".into()),
            ],
            log: child_log(&format!("awareness-ingest-{name}")),
        };
        let mut daemon = ChildDaemon::spawn(&config);
        daemon.wait_healthy(Duration::from_secs(60)).await;
        Setup {
            daemon,
            http: reqwest::Client::new(),
            _plugins: plugins,
            _data: data,
        }
    }

    /// `POST /ingest` with `body` (raw text) and the secret header when
    /// `secret` is given. Returns the status and the JSON answer.
    async fn post_raw(&self, body: &str, secret: Option<&str>) -> (u16, serde_json::Value) {
        let mut req = self
            .http
            .post(format!("{}/ingest", self.daemon.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(secret) = secret {
            req = req.header("x-ingest-secret", secret);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("answer {status} is not JSON: {text}"));
        (status, value)
    }

    async fn post(&self, body: &serde_json::Value) -> (u16, serde_json::Value) {
        self.post_raw(&body.to_string(), Some(SECRET)).await
    }

    /// `GET /v1/events/{id}`: status and answer.
    async fn event(&self, id: &str) -> (u16, serde_json::Value) {
        let r = self
            .http
            .get(format!("{}/v1/events/{id}", self.daemon.base))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// `outboxd_events_ingested_total{outcome}` from `/metrics`.
    async fn ingested(&self, outcome: &str) -> f64 {
        let text = self
            .http
            .get(format!("{}/metrics", self.daemon.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let needle = format!("outboxd_events_ingested_total{{outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&needle))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0.0)
    }
}

/// A body as the eVault's awareness outbox dispatcher POSTs it.
fn body(event_id: &str, packet: &str, data: serde_json::Value, version: u64) -> serde_json::Value {
    json!({
        "eventId": event_id,
        "id": packet,
        "w3id": "@owner-1",
        "evaultPublicKey": "z6Mk-test-key",
        "data": data,
        "schemaId": "550e8400-e29b-41d4-a716-446655440000",
        "operation": if version == 1 { "create" } else { "update" },
        "requestingPlatform": "https://pictique.example",
        "occurredAt": "2026-12-01T10:00:00.000Z",
        "streamVersion": version,
    })
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", hex::encode(rand::random::<[u8; 4]>()))
}

/// Requests the receiver got for event `id`.
fn received(receiver: &Receiver, id: &str) -> Vec<Received> {
    receiver.with_seen(|seen| {
        seen.iter()
            .filter(|r| r.header("ce-id").as_deref() == Some(id))
            .cloned()
            .collect()
    })
}

async fn wait_received(receiver: &Receiver, id: &str) {
    let arrived = eventually(Duration::from_secs(30), || {
        !received(receiver, id).is_empty()
    })
    .await;
    assert!(arrived, "event {id} never reached the receiver");
}

/// How long a delivery that should not happen is given to show up.
const QUIET: Duration = Duration::from_millis(1500);

async fn a_good_body_is_stored_mapped_and_delivered_and_its_retry_is_a_duplicate(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start().await;
    let s = Setup::start(&db, &receiver, "good").await;
    let (event_id, packet) = (unique("evt"), unique("envelope"));
    let b = body(&event_id, &packet, json!({"title": "hello", "n": 1}), 1);

    let (status, answer) = s.post(&b).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"ok": true, "packetId": packet, "eventId": event_id, "duplicate": false, "deliveriesQueued": 1})
    );

    // Stored with the shared mapping.
    let (status, stored) = s.event(&event_id).await;
    assert_eq!(status, 200, "{stored}");
    let ev = &stored["event"];
    assert_eq!(ev["id"], event_id.as_str());
    assert_eq!(ev["partitionkey"], packet.as_str());
    assert_eq!(ev["sequence"], 1);
    assert_eq!(ev["time"], "2026-12-01T10:00:00.000Z");
    assert_eq!(
        ev["type"],
        "awareness.550e8400-e29b-41d4-a716-446655440000.create"
    );
    assert_eq!(ev["source"], "urn:awareness:@owner-1");
    assert_eq!(ev["datacontenttype"], "application/json");
    assert_eq!(ev["w3id"], "@owner-1");
    assert_eq!(ev["evaultpublickey"], "z6Mk-test-key");
    assert_eq!(ev["schemaid"], "550e8400-e29b-41d4-a716-446655440000");
    assert_eq!(ev["operation"], "create");
    assert_eq!(ev["requestingplatform"], "https://pictique.example");
    assert_eq!(ev["data"], json!({"title": "hello", "n": 1}));

    // Delivered through the webhook sink.
    wait_received(&receiver, &event_id).await;
    let first = &received(&receiver, &event_id)[0];
    assert_eq!(
        first.header("ce-partitionkey").as_deref(),
        Some(packet.as_str())
    );
    assert_eq!(first.header("ce-sequence").as_deref(), Some("1"));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&first.body).unwrap(),
        json!({"title": "hello", "n": 1})
    );

    // The dispatcher's retry (the same body, keys in another order): a
    // duplicate, nothing queued, nothing delivered twice.
    let retry = format!(
        r#"{{ "streamVersion": 1, "data": {{ "n": 1, "title": "hello" }}, "id": "{packet}",
              "eventId": "{event_id}", "w3id": "@owner-1", "evaultPublicKey": "z6Mk-test-key",
              "schemaId": "550e8400-e29b-41d4-a716-446655440000", "operation": "create",
              "requestingPlatform": "https://pictique.example", "occurredAt": "2026-12-01T10:00:00.000Z" }}"#
    );
    let (status, answer) = s.post_raw(&retry, Some(SECRET)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["duplicate"], true);
    assert_eq!(answer["deliveriesQueued"], 0);
    assert_eq!(answer["eventId"], event_id.as_str());
    tokio::time::sleep(QUIET).await;
    assert_eq!(received(&receiver, &event_id).len(), 1, "delivered twice");
    let (_, stored) = s.event(&event_id).await;
    assert_eq!(stored["deliveries"].as_array().unwrap().len(), 1);
    assert_eq!(stored["deliveries"][0]["status"], "delivered");

    // Counted like HTTP ingests.
    assert_eq!(s.ingested("stored").await, 1.0);
    assert_eq!(s.ingested("duplicate").await, 1.0);
    db.cleanup().await;
}

async fn a_reused_event_id_with_other_content_is_409_and_changes_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start().await;
    let s = Setup::start(&db, &receiver, "conflict").await;
    let (event_id, packet) = (unique("evt"), unique("envelope"));
    let (status, answer) = s
        .post(&body(&event_id, &packet, json!({"state": "A"}), 1))
        .await;
    assert_eq!(status, 200, "{answer}");
    wait_received(&receiver, &event_id).await;

    let (status, answer) = s
        .post(&body(&event_id, &packet, json!({"state": "different"}), 1))
        .await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["field"], "eventId");
    assert_eq!(answer["attributes"], json!(["data"]));
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "eventId {event_id} was already used for a different event"
        )),
        "{message}"
    );

    let (_, stored) = s.event(&event_id).await;
    assert_eq!(
        stored["event"]["data"],
        json!({"state": "A"}),
        "overwritten"
    );
    assert_eq!(stored["deliveries"].as_array().unwrap().len(), 1);
    tokio::time::sleep(QUIET).await;
    let got = received(&receiver, &event_id);
    assert_eq!(got.len(), 1);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&got[0].body).unwrap(),
        json!({"state": "A"})
    );
    assert_eq!(s.ingested("conflict").await, 1.0);
    db.cleanup().await;
}

async fn bad_bodies_are_400_naming_the_field_and_store_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start().await;
    let s = Setup::start(&db, &receiver, "bad").await;
    let good = || body("evt-bad", "envelope-bad", json!({"k": 1}), 1);
    let without = |field: &str| {
        let mut b = good();
        b.as_object_mut().unwrap().remove(field);
        b.to_string()
    };
    let with = |field: &str, value: serde_json::Value| {
        let mut b = good();
        b[field] = value;
        b.to_string()
    };
    let cases: Vec<(String, &str)> = vec![
        (without("id"), "id"),
        (without("schemaId"), "schemaId"),
        (with("id", json!("")), "id"),
        (with("id", json!(42)), "id"),
        (with("schemaId", json!(["a"])), "schemaId"),
        (with("w3id", json!(7)), "w3id"),
        (with("data", json!("text")), "data"),
        (with("streamVersion", json!("seven")), "streamVersion"),
        (with("streamVersion", json!(2.5)), "streamVersion"),
        (with("operation", json!("upsert")), "operation"),
        (with("occurredAt", json!("last tuesday")), "occurredAt"),
        (with("eventId", json!({"id": 1})), "eventId"),
        (with("colour", json!("red")), "colour"),
        ("{\"id\": \"envelope-bad\", ".to_string(), "body"),
        ("not json at all".to_string(), "body"),
        ("[1, 2]".to_string(), "body"),
    ];
    // Over ingest.max-body-bytes (1 MiB): 413, as on POST /v1/events.
    let huge = with("data", json!({"pad": "x".repeat(1 << 20)}));
    let (status, answer) = s.post_raw(&huge, Some(SECRET)).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["field"], "body");
    for (text, field) in &cases {
        let (status, answer) = s.post_raw(text, Some(SECRET)).await;
        assert_eq!(status, 400, "{text} → {answer}");
        assert_eq!(answer["field"], *field, "{text} → {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(field),
            "the error names {field}: {answer}"
        );
    }
    let (status, _) = s.event("evt-bad").await;
    assert_eq!(status, 404, "a refused body was stored");
    assert_eq!(s.ingested("rejected").await, cases.len() as f64 + 1.0);
    assert_eq!(s.ingested("stored").await, 0.0);

    // The same body, corrected, goes in.
    let (status, answer) = s.post(&good()).await;
    assert_eq!(status, 200, "{answer}");
    db.cleanup().await;
}

async fn a_missing_or_wrong_secret_is_401_and_stores_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start().await;
    let s = Setup::start(&db, &receiver, "secret").await;
    let b = body("evt-secret", "envelope-secret", json!({"k": 1}), 1).to_string();
    for secret in [
        None,
        Some(""),
        Some("wrong"),
        Some(&SECRET[..SECRET.len() - 1]),
        Some(&*format!("{SECRET}x")),
    ] {
        let (status, answer) = s.post_raw(&b, secret).await;
        assert_eq!(status, 401, "secret {secret:?} → {answer}");
        assert_eq!(answer["error"], "invalid ingest secret");
    }
    let (status, _) = s.event("evt-secret").await;
    assert_eq!(status, 404, "stored without the secret");
    tokio::time::sleep(QUIET).await;
    assert_eq!(receiver.count(), 0);
    assert_eq!(s.ingested("stored").await, 0.0);

    let (status, answer) = s.post_raw(&b, Some(SECRET)).await;
    assert_eq!(status, 200, "{answer}");
    db.cleanup().await;
}

async fn a_b_a_on_one_packet_is_three_events_delivered_in_order(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start().await;
    let s = Setup::start(&db, &receiver, "aba").await;
    let packet = unique("envelope");
    let ids: Vec<String> = (1..=3).map(|i| format!("{packet}-v{i}")).collect();
    // The same content twice (A, B, A), without streamVersion: outboxd
    // assigns the sequence.
    for (id, state) in ids.iter().zip(["A", "B", "A"]) {
        let mut b = body(id, &packet, json!({"state": state}), 1);
        b.as_object_mut().unwrap().remove("streamVersion");
        let (status, answer) = s.post(&b).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["duplicate"], false, "{id}: {answer}");
        assert_eq!(answer["deliveriesQueued"], 1);
    }
    for id in &ids {
        wait_received(&receiver, id).await;
    }
    let order: Vec<(String, String, serde_json::Value)> = receiver.with_seen(|seen| {
        seen.iter()
            .filter(|r| r.header("ce-partitionkey").as_deref() == Some(packet.as_str()))
            .map(|r| {
                (
                    r.header("ce-id").unwrap(),
                    r.header("ce-sequence").unwrap(),
                    serde_json::from_slice(&r.body).unwrap(),
                )
            })
            .collect()
    });
    assert_eq!(
        order,
        vec![
            (ids[0].clone(), "1".into(), json!({"state": "A"})),
            (ids[1].clone(), "2".into(), json!({"state": "B"})),
            (ids[2].clone(), "3".into(), json!({"state": "A"})),
        ]
    );

    // Without an eventId each POST is a new event, with a generated id.
    let mut b = body("unused", &packet, json!({"state": "C"}), 1);
    b.as_object_mut().unwrap().remove("eventId");
    b.as_object_mut().unwrap().remove("streamVersion");
    let (status, first) = s.post(&b).await;
    assert_eq!(status, 200, "{first}");
    let (status, second) = s.post(&b).await;
    assert_eq!(status, 200, "{second}");
    let generated = first["eventId"].as_str().unwrap();
    assert_eq!(generated.len(), 36, "a UUID: {generated}");
    assert_ne!(first["eventId"], second["eventId"]);
    assert_eq!(second["duplicate"], false);
    db.cleanup().await;
}

async fn stream_versions_are_kept_and_a_non_increasing_one_is_409(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start().await;
    let s = Setup::start(&db, &receiver, "versions").await;
    let packet = unique("envelope");
    for (id, version) in [("v5", 5), ("v9", 9)] {
        let id = format!("{packet}-{id}");
        let (status, answer) = s
            .post(&body(&id, &packet, json!({"v": version}), version))
            .await;
        assert_eq!(status, 200, "{answer}");
        let (_, stored) = s.event(&id).await;
        assert_eq!(stored["event"]["sequence"], version, "{stored}");
        wait_received(&receiver, &id).await;
        assert_eq!(
            received(&receiver, &id)[0].header("ce-sequence"),
            Some(version.to_string())
        );
    }
    // A streamVersion the packet already passed: the store's 409.
    let stale = format!("{packet}-v7");
    let (status, answer) = s.post(&body(&stale, &packet, json!({"v": 7}), 7)).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["field"], "streamVersion");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("last version is 9"),
        "{answer}"
    );
    let (status, _) = s.event(&stale).await;
    assert_eq!(status, 404, "a stale version was stored");
    // A string of digits is a version too (the service keeps it as bigint).
    let id = format!("{packet}-v10");
    let mut b = body(&id, &packet, json!({"v": 10}), 10);
    b["streamVersion"] = json!("10");
    let (status, answer) = s.post(&b).await;
    assert_eq!(status, 200, "{answer}");
    let (_, stored) = s.event(&id).await;
    assert_eq!(stored["event"]["sequence"], 10);
    db.cleanup().await;
}

/// `outboxd config show` hides the secret unless it is a bare `${VAR}`
/// reference, and an unknown key under `[ingest.awareness]` stops the
/// start naming it.
#[test]
fn config_show_redacts_the_secret_and_unknown_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let show = |toml: &str| {
        let file = dir.path().join("outboxd.toml");
        std::fs::write(&file, toml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
            .arg("--config")
            .arg(&file)
            .args(["config", "show"])
            .env("AWARENESS_INGEST_SECRET", "from-the-environment")
            .env_remove("OUTBOXD_INGEST__AWARENESS__SECRET")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, text) = show("[ingest.awareness]\nsecret = \"literal-secret-value\"\n");
    assert!(ok, "{text}");
    assert!(!text.contains("literal-secret-value"), "{text}");
    assert!(text.contains("secret = \"***\""), "{text}");
    assert!(text.contains("path = \"/ingest\""), "{text}");

    let (ok, text) = show("[ingest.awareness]\nsecret = \"${AWARENESS_INGEST_SECRET}\"\n");
    assert!(ok, "{text}");
    assert!(text.contains("${AWARENESS_INGEST_SECRET}"), "{text}");
    assert!(!text.contains("from-the-environment"), "{text}");

    let (ok, text) = show("[ingest.awareness]\nsecret = \"s\"\nsecrte = \"typo\"\n");
    assert!(!ok, "{text}");
    assert!(text.contains("secrte"), "the error names the key: {text}");

    let (ok, text) = show("[ingest.awareness]\nsecret = \"${AWARENESS_UNSET_VARIABLE}\"\n");
    assert!(!ok, "{text}");
    assert!(text.contains("ingest.awareness.secret"), "{text}");
    assert!(text.contains("AWARENESS_UNSET_VARIABLE"), "{text}");

    let (ok, text) = show("[ingest.awareness]\nsecret = \"s\"\npath = \"/v1/events\"\n");
    assert!(!ok, "{text}");
    assert!(text.contains("ingest.awareness.path"), "{text}");
}

/// The store down: `503` and nothing acknowledged; the producer's retry
/// after the store is back is stored and delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_outage_is_503_and_the_retry_after_it_is_stored_and_delivered() {
    let pg = PrivatePostgres::init();
    let receiver = Receiver::start().await;
    let s = Setup::start_on(&pg.url(), &receiver, "outage").await;
    let packet = unique("envelope");
    let (before, during) = (format!("{packet}-1"), format!("{packet}-2"));
    let (status, answer) = s.post(&body(&before, &packet, json!({"n": 1}), 1)).await;
    assert_eq!(status, 200, "{answer}");
    wait_received(&receiver, &before).await;

    pg.stop();
    let b = body(&during, &packet, json!({"n": 2}), 2);
    let (status, answer) = s.post(&b).await;
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("nothing stored"),
        "{answer}"
    );

    pg.start();
    // The producer retries until the store is back.
    let start = std::time::Instant::now();
    loop {
        let (status, answer) = s.post(&b).await;
        if status == 200 {
            assert_eq!(answer["duplicate"], false, "{answer}");
            break;
        }
        assert_eq!(status, 503, "{answer}");
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the store did not come back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_received(&receiver, &during).await;
    tokio::time::sleep(QUIET).await;
    let ids: Vec<String> =
        receiver.with_seen(|seen| seen.iter().filter_map(|r| r.header("ce-id")).collect());
    assert_eq!(ids, [before, during]);
}
