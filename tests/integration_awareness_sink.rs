//! The `awareness` sink end to end: HTTP ingest → store (SQLite and
//! PostgreSQL) → the WebAssembly `awareness` sink → a loopback server that
//! answers `POST /ingest` as the awareness service does (x-ingest-secret
//! compared in constant time, 401 on a mismatch, 400 without `id` or
//! `schemaId`, 200 `{ok, packetId, eventId, duplicate, deliveriesQueued}`),
//! with answers scripted per event id.

mod common;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use common::{both_stores, *};
use serde_json::{json, Value};

/// One `POST /ingest` as the service saw it.
#[derive(Debug, Clone)]
struct Seen {
    /// The raw body.
    raw: String,
    body: Value,
    /// The `x-ingest-secret` header.
    secret: Option<String>,
    /// The status answered.
    status: u16,
    /// When it arrived.
    at: Instant,
}

/// A scripted answer: status, an extra header, body.
type Scripted = (u16, Option<(&'static str, String)>, String);

#[derive(Default)]
struct ServiceState {
    /// The secret the service takes.
    secret: String,
    /// Answers (status, extra header, body) per eventId, used in order;
    /// when none is left, 200.
    script: HashMap<String, VecDeque<Scripted>>,
    seen: Vec<Seen>,
}

/// A loopback stand-in for the awareness service's `POST /ingest`.
#[derive(Clone)]
struct AwarenessService {
    addr: std::net::SocketAddr,
    state: Arc<Mutex<ServiceState>>,
}

impl AwarenessService {
    async fn start(secret: &str) -> AwarenessService {
        let state = Arc::new(Mutex::new(ServiceState {
            secret: secret.into(),
            ..ServiceState::default()
        }));
        let app = axum::Router::new()
            .route("/ingest", axum::routing::post(ingest))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        AwarenessService { addr, state }
    }

    fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn script(&self, event_id: &str, status: u16, body: Value) {
        self.script_with(event_id, status, None, body);
    }

    fn script_with(
        &self,
        event_id: &str,
        status: u16,
        header: Option<(&'static str, &str)>,
        body: Value,
    ) {
        self.state
            .lock()
            .unwrap()
            .script
            .entry(event_id.into())
            .or_default()
            .push_back((
                status,
                header.map(|(k, v)| (k, v.to_string())),
                body.to_string(),
            ));
    }

    fn set_secret(&self, secret: &str) {
        self.state.lock().unwrap().secret = secret.into();
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// The requests the service answered 200, in arrival order.
    fn accepted(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.status == 200)
            .collect()
    }
}

async fn ingest(
    State(state): State<Arc<Mutex<ServiceState>>>,
    headers: HeaderMap,
    raw: Bytes,
) -> (StatusCode, HeaderMap, String) {
    let mut state = state.lock().unwrap();
    let secret = headers
        .get("x-ingest-secret")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let event_id = body["eventId"].as_str().unwrap_or_default().to_string();
    let (status, header, answer) = if !constant_time_eq(
        secret.as_deref().unwrap_or_default().as_bytes(),
        state.secret.as_bytes(),
    ) {
        (
            401,
            None,
            json!({"error": "invalid ingest secret"}).to_string(),
        )
    } else if !body["id"].is_string() || !body["schemaId"].is_string() {
        let error = json!({"error": "id and schemaId are required"});
        (400, None, error.to_string())
    } else if let Some(next) = state
        .script
        .get_mut(&event_id)
        .and_then(VecDeque::pop_front)
    {
        next
    } else {
        let ok = json!({"ok": true, "packetId": body["id"], "eventId": event_id, "duplicate": false, "deliveriesQueued": 1});
        (200, None, ok.to_string())
    };
    state.seen.push(Seen {
        raw: String::from_utf8_lossy(&raw).into_owned(),
        body,
        secret,
        status,
        at: Instant::now(),
    });
    let mut extra = HeaderMap::new();
    if let Some((name, value)) = header {
        extra.insert(name, value.parse().unwrap());
    }
    (StatusCode::from_u16(status).unwrap(), extra, answer)
}

/// A plugins folder with the awareness sink pointed at `service`, sending
/// `secret`.
fn plugins(service: &AwarenessService, secret: &str) -> PluginsDir {
    let plugins = PluginsDir::new();
    plugins.add_component(
        "awareness",
        &built_plugins().join("awareness.wasm"),
        &format!(
            "[limits]\ndeadline = \"10s\"\nmax-batch = 50\n\
             [capabilities]\nhttp = [{:?}]\n\
             [retry]\nbase = \"100ms\"\ncap = \"500ms\"\n\
             [config]\nurl = {:?}\nsecret = {secret:?}\n",
            service.origin(),
            service.origin()
        ),
    );
    plugins
}

async fn start(plugins: &PluginsDir, db: &TestDb) -> TestDaemon {
    let url = db.url.clone();
    TestDaemon::start_with(plugins.path(), move |c| c.database_url = Some(url)).await
}

/// A vault mutation as a CloudEvent by the shared mapping: stream = packet,
/// the packet fields as extensions.
fn mutation(event_id: &str, packet: &str, version: u64, data: Value) -> Value {
    let mut e = event(event_id, packet, "w3ds.metaenvelope.update", data);
    e["sequence"] = json!(version);
    e["time"] = json!(format!("2026-11-30T01:02:{:02}.000Z", version % 60));
    e["w3id"] = json!("@owner-1");
    e["evaultpublickey"] = json!("z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK");
    e["schemaid"] = json!("550e8400-e29b-41d4-a716-446655440000");
    e["operation"] = json!(if version == 1 { "create" } else { "update" });
    e["requestingplatform"] = json!("https://blabsy.example");
    e
}

/// Where each key stands in the raw body; panics if one is missing.
fn key_positions(raw: &str, keys: &[&str]) -> Vec<usize> {
    keys.iter()
        .map(|k| {
            raw.find(&format!("\"{k}\":"))
                .unwrap_or_else(|| panic!("no {k} in {raw}"))
        })
        .collect()
}

const INGEST_KEYS: [&str; 10] = [
    "eventId",
    "id",
    "w3id",
    "evaultPublicKey",
    "data",
    "schemaId",
    "operation",
    "requestingPlatform",
    "occurredAt",
    "streamVersion",
];

both_stores!(
    every_field_arrives_by_the_mapping_in_packet_order,
    a_409_and_a_400_are_dead_lettered_with_the_services_reason_a_503_and_a_429_are_retried,
    a_refused_secret_is_retried_without_dead_letters_until_the_secret_is_fixed,
);

async fn every_field_arrives_by_the_mapping_in_packet_order(backend: Backend) {
    let service = AwarenessService::start("ingest-s3cret").await;
    let plugins = plugins(&service, "ingest-s3cret");
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db).await;

    // The service answers one event as a duplicate: still delivered.
    service.script(
        "c-2",
        200,
        json!({"ok": true, "packetId": "packet-c", "eventId": "c-2", "duplicate": true, "deliveriesQueued": 0}),
    );
    // Three packets, four versions each; packet b goes A → B → A.
    let mut sent = BTreeMap::new();
    for version in 1..=4u64 {
        let batch: Vec<Value> = ["a", "b", "c"]
            .iter()
            .map(|p| {
                let data = match *p {
                    "b" => json!({"state": if version == 2 { "B" } else { "A" }}),
                    _ => {
                        json!({"title": format!("Zoë \"{p}\" v{version}\n"), "tags": [p, version]})
                    }
                };
                let e = mutation(
                    &format!("{p}-{version}"),
                    &format!("packet-{p}"),
                    version,
                    data,
                );
                sent.insert(format!("{p}-{version}"), e.clone());
                e
            })
            .collect();
        d.post_batch(&batch).await;
    }
    // A mutation without the optional fields: they arrive as null.
    let mut bare = event(
        "bare-1",
        "packet-bare",
        "w3ds.metaenvelope.create",
        json!({}),
    );
    bare["schemaid"] = json!("schema-x");
    bare["sequence"] = json!(1);
    d.post_event(&bare).await;

    for id in sent.keys().chain(["bare-1".to_string()].iter()) {
        d.wait_sink(id, "awareness", Duration::from_secs(30), |x| {
            x["status"] == "delivered"
        })
        .await;
    }
    let accepted = service.accepted();
    assert_eq!(accepted.len(), sent.len() + 1, "each event once");

    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for s in &accepted {
        assert_eq!(s.secret.as_deref(), Some("ingest-s3cret"));
        let positions = key_positions(&s.raw, &INGEST_KEYS);
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "keys out of the dispatcher's order: {}",
            s.raw
        );
        let b = &s.body;
        let id = b["eventId"].as_str().unwrap();
        let packet = b["id"].as_str().unwrap().to_string();
        let version = b["streamVersion"].as_u64().unwrap();
        let prev = last.insert(packet.clone(), version).unwrap_or(0);
        assert!(
            version > prev,
            "packet {packet} went from {prev} to {version}"
        );
        if id == "bare-1" {
            assert_eq!(b["schemaId"], "schema-x");
            for absent in ["w3id", "evaultPublicKey", "operation", "requestingPlatform"] {
                assert_eq!(b[absent], Value::Null, "{absent} in {}", s.raw);
            }
            continue;
        }
        let e = &sent[id];
        assert_eq!(b["id"], e["partitionkey"]);
        assert_eq!(b["streamVersion"], e["sequence"]);
        assert_eq!(b["occurredAt"], e["time"]);
        assert_eq!(b["data"], e["data"]);
        assert_eq!(b["w3id"], e["w3id"]);
        assert_eq!(b["evaultPublicKey"], e["evaultpublickey"]);
        assert_eq!(b["schemaId"], e["schemaid"]);
        assert_eq!(b["operation"], e["operation"]);
        assert_eq!(b["requestingPlatform"], e["requestingplatform"]);
    }
    assert_eq!(last.len(), 4);
    let b_states: Vec<Value> = accepted
        .iter()
        .filter(|s| s.body["id"] == "packet-b")
        .map(|s| s.body["data"]["state"].clone())
        .collect();
    assert_eq!(b_states, [json!("A"), json!("B"), json!("A"), json!("A")]);
    d.stop().await;
    db.cleanup().await;
}

async fn a_409_and_a_400_are_dead_lettered_with_the_services_reason_a_503_and_a_429_are_retried(
    backend: Backend,
) {
    let service = AwarenessService::start("k").await;
    let plugins = plugins(&service, "k");
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db).await;
    service.script(
        "conflict-1",
        409,
        json!({"error": "eventId conflict-1 was already used for a different event"}),
    );
    service.script(
        "bad-1",
        400,
        json!({"error": "id and schemaId are required"}),
    );
    service.script("busy-1", 503, json!({"error": "ingest failed"}));
    service.script("busy-1", 503, json!({"error": "ingest failed"}));
    service.script_with(
        "slow-1",
        429,
        Some(("retry-after", "1")),
        json!({"error": "slow down"}),
    );

    d.post_batch(&[
        mutation("conflict-1", "p1", 1, json!({})),
        mutation("bad-1", "p2", 1, json!({})),
        mutation("busy-1", "p3", 1, json!({})),
        mutation("slow-1", "p4", 1, json!({})),
    ])
    .await;

    let dead = d
        .wait_sink("conflict-1", "awareness", Duration::from_secs(20), |x| {
            x["status"] == "dead"
        })
        .await;
    let reason = dead["last_error"].as_str().unwrap();
    assert!(
        reason.contains("409") && reason.contains("already used for a different event"),
        "{reason}"
    );
    assert_eq!(dead["attempts"], 1);
    let dead = d
        .wait_sink("bad-1", "awareness", Duration::from_secs(20), |x| {
            x["status"] == "dead"
        })
        .await;
    let reason = dead["last_error"].as_str().unwrap();
    assert!(
        reason.contains("400") && reason.contains("id and schemaId are required"),
        "{reason}"
    );
    assert_eq!(dead["attempts"], 1);
    let done = d
        .wait_sink("busy-1", "awareness", Duration::from_secs(20), |x| {
            x["status"] == "delivered"
        })
        .await;
    assert_eq!(done["attempts"], 3, "{done}");
    // 429 with Retry-After: 1 is retried no sooner than a second later
    // (the retry base here is 100 ms).
    let done = d
        .wait_sink("slow-1", "awareness", Duration::from_secs(20), |x| {
            x["status"] == "delivered"
        })
        .await;
    assert_eq!(done["attempts"], 2, "{done}");
    let slow: Vec<Instant> = service
        .seen()
        .iter()
        .filter(|s| s.body["eventId"] == "slow-1")
        .map(|s| s.at)
        .collect();
    assert_eq!(slow.len(), 2);
    let waited = slow[1] - slow[0];
    assert!(
        waited >= Duration::from_millis(950),
        "retried after {waited:?}"
    );
    d.stop().await;
    db.cleanup().await;
}

async fn a_refused_secret_is_retried_without_dead_letters_until_the_secret_is_fixed(
    backend: Backend,
) {
    // The service's secret was rotated; the sink still sends the old one.
    let service = AwarenessService::start("rotated").await;
    let plugins = plugins(&service, "before-rotation");
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db).await;

    let ids: Vec<String> = (1..=3)
        .flat_map(|v| [format!("x-{v}"), format!("y-{v}")])
        .collect();
    for version in 1..=3u64 {
        d.post_batch(&[
            mutation(
                &format!("x-{version}"),
                "px",
                version,
                json!({"v": version}),
            ),
            mutation(
                &format!("y-{version}"),
                "py",
                version,
                json!({"v": version}),
            ),
        ])
        .await;
    }
    // The heads keep being retried, saying why; nothing is dead.
    for head in ["x-1", "y-1"] {
        let state = d
            .wait_sink(head, "awareness", Duration::from_secs(20), |x| {
                x["attempts"].as_u64().unwrap_or(0) >= 3
            })
            .await;
        assert_ne!(state["status"], "dead", "{state}");
        let reason = state["last_error"].as_str().unwrap_or_default();
        assert!(
            reason.contains("401") && reason.contains("ingest secret"),
            "{reason}"
        );
    }
    for id in &ids {
        let x = d.delivery(id, "awareness").await.unwrap();
        assert_ne!(x["status"], "dead", "{id}: {x}");
        assert_ne!(x["status"], "delivered", "{id}: {x}");
    }
    assert!(service.accepted().is_empty());
    assert!(service.seen().iter().all(|s| s.status == 401));
    // Readiness shows why the sink delivers nothing.
    let (_, ready) = d.get("/ready").await;
    let worker = &ready["checks"]["workers"]["sinks"]["awareness"];
    assert_eq!(worker["delivering"], false, "{ready}");
    assert!(
        worker["last_failure"]
            .as_str()
            .is_some_and(|r| r.contains("401") && r.contains("ingest secret")),
        "{ready}"
    );

    // The service takes the sink's secret again: the backlog goes through.
    service.set_secret("before-rotation");
    for id in &ids {
        d.wait_sink(id, "awareness", Duration::from_secs(30), |x| {
            x["status"] == "delivered"
        })
        .await;
    }
    let (_, ready) = d.get("/ready").await;
    assert_eq!(
        ready["checks"]["workers"]["sinks"]["awareness"]["delivering"], true,
        "{ready}"
    );
    let order: Vec<(String, u64)> = service
        .accepted()
        .iter()
        .map(|s| {
            (
                s.body["id"].as_str().unwrap().to_string(),
                s.body["streamVersion"].as_u64().unwrap(),
            )
        })
        .collect();
    for packet in ["px", "py"] {
        let versions: Vec<u64> = order
            .iter()
            .filter(|(p, _)| p == packet)
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(versions, [1, 2, 3], "packet {packet}");
    }
    d.stop().await;
    db.cleanup().await;
}

/// `outboxd plugin check` on the shipped component with its shipped
/// manifest, enabled as the operator enables it (`awareness.toml.example`
/// copied to `awareness.toml`).
fn check_shipped(env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("awareness.wasm");
    std::fs::copy(built_plugins().join("awareness.wasm"), &wasm).unwrap();
    std::fs::copy(
        built_plugins().join("awareness.toml.example"),
        dir.path().join("awareness.toml"),
    )
    .unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
    command.args(["plugin", "check"]).arg(&wasm);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OUTBOXD_") {
            command.env_remove(key);
        }
    }
    let out = command.envs(env.iter().copied()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "check refused the shipped sink:\n{text}"
    );
    text
}

#[test]
fn the_shipped_manifest_takes_the_ingest_secret_from_the_environment() {
    // Not installed enabled: the default plugins directory loads without it.
    assert!(!built_plugins().join("awareness.toml").exists());

    let text = check_shipped(&[]);
    assert!(text.contains("verdict: ok"), "{text}");
    let needs = text
        .split_once("needs at start:")
        .unwrap_or_else(|| panic!("no `needs at start` section:\n{text}"))
        .1;
    assert!(
        needs.contains("OUTBOXD_AWARENESS_INGEST_SECRET (for config.secret)"),
        "{text}"
    );
    let text = check_shipped(&[("OUTBOXD_AWARENESS_INGEST_SECRET", "s3cret")]);
    assert!(
        text.contains("verdict: ok") && !text.contains("needs at start"),
        "{text}"
    );
}
