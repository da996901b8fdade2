//! Producers on a network: every HTTP ingest request authenticates with a
//! producer token, stays inside its scope and under its rate, or is
//! refused with a stable code and nothing of it stored. Run on both
//! stores; every refusal is checked against the count of stored events
//! before and after it.

mod common;

use std::time::Duration;

use common::{both_stores, event, eventually, Backend, Harness, TestDb};
use outboxd::auth::ProducerAuth;
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-for-tests";
const T: Duration = Duration::from_secs(20);

/// Events stored in `db`, counted in its own table (what a refusal must
/// leave unchanged).
async fn stored(db: &TestDb) -> i64 {
    use sqlx::Connection;
    if db.url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query_scalar("SELECT count(*) FROM outboxd.events")
            .fetch_one(&mut c)
            .await
            .unwrap()
    } else {
        let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
        sqlx::query_scalar("SELECT count(*) FROM events")
            .fetch_one(&mut c)
            .await
            .unwrap()
    }
}

/// A daemon on `db` that requires producer tokens, with one webhook sink.
async fn daemon(
    db: &TestDb,
    adjust: impl FnOnce(&mut outboxd::config::Config) + 'static,
) -> Harness {
    let url = db.url.clone();
    Harness::new()
        .webhook("hook", "")
        .config(move |c| {
            c.database_url = Some(url);
            c.admin.token = Some(ADMIN.into());
            c.producers.auth = Some(ProducerAuth::Required);
            adjust(c);
        })
        .start()
        .await
}

/// `method path` on the admin API with the admin token: status and body.
async fn admin(
    h: &Harness,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let d = &h.daemon;
    let mut r = d
        .http
        .request(method, format!("{}{path}", d.base))
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        r = r.json(&body);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Create producer `spec` (its `name` and scope); its token.
async fn producer(h: &Harness, spec: Value) -> String {
    let (status, body) = admin(h, reqwest::Method::POST, "/v1/admin/producers", Some(spec)).await;
    assert_eq!(status, 201, "{body}");
    let token = body["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("obx_"), "{token}");
    token
}

/// POST `body` to `/v1/events` (a batch when it is an array) with the
/// `Authorization` value `auth`: status, `Retry-After`, body.
async fn post(h: &Harness, auth: Option<&str>, body: &Value) -> (u16, Option<String>, Value) {
    let d = &h.daemon;
    let content_type = if body.is_array() {
        "application/cloudevents-batch+json"
    } else {
        "application/cloudevents+json"
    };
    let mut r = d
        .http
        .post(format!("{}/v1/events", d.base))
        .header("content-type", content_type)
        .body(body.to_string());
    if let Some(auth) = auth {
        r = r.header("authorization", auth);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (status, retry, r.json().await.unwrap_or(Value::Null))
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Post `body` as `auth`, expect `status` and `code`, and check the store
/// holds exactly as many events afterwards as before.
async fn refused(
    h: &Harness,
    db: &TestDb,
    auth: Option<&str>,
    body: &Value,
    status: u16,
    code: &str,
) -> Value {
    let before = stored(db).await;
    let (got, _, answer) = post(h, auth, body).await;
    assert_eq!(
        (got, answer["code"].as_str()),
        (status, Some(code)),
        "{answer}"
    );
    assert_eq!(
        stored(db).await,
        before,
        "a refused request stored something: {answer}"
    );
    answer
}

async fn hostile_requests_store_nothing_and_accepted_ones_name_their_producer(backend: Backend) {
    let db = TestDb::new(backend).await;
    let h = daemon(&db, |_| {}).await;
    let billing = producer(&h, json!({"name": "billing", "scope": {"types": ["invoice.*"], "sources": ["https://example.com/"]}})).await;
    let shop = producer(&h, json!({"name": "shop"})).await;
    let ok = event("b1", "acct-1", "invoice.paid", json!({"n": 1}));

    // No credential, a malformed one, the admin token, another scheme.
    let unauthorized = refused(&h, &db, None, &ok, 401, "unauthorized").await;
    for auth in [
        "Bearer nonsense".to_string(),
        bearer(ADMIN),
        format!("Basic {billing}"),
        format!("Bearer {billing}%0A"),
        format!("Bearer {billing}\\n"),
        format!("Bearer {}", &billing[..billing.len() - 1]),
        format!("Bearer {}", "a".repeat(16 * 1024)),
    ] {
        let answer = refused(&h, &db, Some(&auth), &ok, 401, "unauthorized").await;
        // Every authentication refusal reads the same, whatever was wrong.
        assert_eq!(answer, unauthorized);
    }
    // A token with one character changed in its secret: well-formed, wrong.
    let mut forged = billing.clone().into_bytes();
    let last = forged.len() - 1;
    forged[last] = if forged[last] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    assert_eq!(
        refused(&h, &db, Some(&bearer(&forged)), &ok, 401, "unauthorized").await,
        unauthorized
    );
    // A header far over any token's length, even past the server's limit.
    let before = stored(&db).await;
    let (status, _, _) = post(&h, Some(&format!("Bearer {}", "x".repeat(200 * 1024))), &ok).await;
    assert!((400..500).contains(&status), "a huge header: {status}");
    assert_eq!(stored(&db).await, before);

    // Out of scope: a single event, and one event inside a batch (the
    // whole batch refused).
    let answer = refused(
        &h,
        &db,
        Some(&bearer(&billing)),
        &event("b2", "acct-1", "order.created", json!({})),
        403,
        "out-of-scope",
    )
    .await;
    assert_eq!(answer["field"], "type", "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("order.created"),
        "{answer}"
    );
    let batch = json!([
        ok.clone(),
        event("b3", "acct-1", "order.created", json!({}))
    ]);
    let answer = refused(
        &h,
        &db,
        Some(&bearer(&billing)),
        &batch,
        403,
        "out-of-scope",
    )
    .await;
    assert_eq!(answer["field"], "[1].type", "{answer}");
    let mut foreign = ok.clone();
    foreign["id"] = json!("b4");
    foreign["source"] = json!("https://attacker.example/");
    let answer = refused(
        &h,
        &db,
        Some(&bearer(&billing)),
        &foreign,
        403,
        "out-of-scope",
    )
    .await;
    assert_eq!(answer["field"], "source", "{answer}");

    // Accepted (`Bearer` and the token may be several spaces apart, RFC
    // 6750 §2.1), and attributed.
    let (status, _, body) = post(&h, Some(&format!("Bearer  {billing}")), &ok).await;
    assert_eq!(status, 201, "{body}");
    let (status, _, body) = post(
        &h,
        Some(&bearer(&shop)),
        &event("s1", "cart-1", "order.created", json!({})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (_, view) = admin(&h, reqwest::Method::GET, "/v1/admin/events/b1", None).await;
    assert_eq!(view["producer"], "billing", "{view}");
    let (_, view) = admin(&h, reqwest::Method::GET, "/v1/admin/events/s1", None).await;
    assert_eq!(view["producer"], "shop", "{view}");
    // The event search finds each producer's events, and only those.
    for (producer, expected) in [("billing", "b1"), ("shop", "s1")] {
        let (status, found) = admin(
            &h,
            reqwest::Method::GET,
            &format!("/v1/admin/events?producer={producer}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{found}");
        let ids: Vec<&str> = found["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [expected], "{producer}: {found}");
    }
    // A producer reads its own events, not another's.
    let read = |token: String, id: &'static str| {
        let d = &h.daemon;
        let request = d
            .http
            .get(format!("{}/v1/events/{id}", d.base))
            .bearer_auth(token);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(read(billing.clone(), "b1").await, 200);
    assert_eq!(read(shop.clone(), "b1").await, 404);

    // A request replayed after its producer was revoked.
    let (status, body) = admin(
        &h,
        reqwest::Method::POST,
        "/v1/admin/producers/shop/revoke",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["producer"]["state"], "revoked", "{body}");
    let replay = event("s2", "cart-1", "order.created", json!({}));
    refused(&h, &db, Some(&bearer(&shop)), &replay, 401, "unauthorized").await;

    // A token past its expiry; it cannot be renewed by a rotation.
    let brief = producer(&h, json!({"name": "brief", "expires_in": "1ms"})).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    refused(&h, &db, Some(&bearer(&brief)), &replay, 401, "unauthorized").await;
    let (status, body) = admin(
        &h,
        reqwest::Method::POST,
        "/v1/admin/producers/brief/rotate",
        Some(json!({})),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("conflict")),
        "{body}"
    );
    let (status, body) = admin(
        &h,
        reqwest::Method::POST,
        "/v1/admin/producers",
        Some(json!({"name": "zero", "expires_in": "0s"})),
    )
    .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("expires_in")),
        "{body}"
    );

    // Rotation without grace: the old token is refused at once.
    let (status, body) = admin(
        &h,
        reqwest::Method::POST,
        "/v1/admin/producers/billing/rotate",
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let rotated = body["token"].as_str().unwrap().to_string();
    let next = event("b5", "acct-1", "invoice.paid", json!({"n": 2}));
    refused(&h, &db, Some(&bearer(&billing)), &next, 401, "unauthorized").await;
    let (status, _, body) = post(&h, Some(&bearer(&rotated)), &next).await;
    assert_eq!(status, 201, "{body}");

    // The list shows no token and no digest.
    let (_, list) = admin(&h, reqwest::Method::GET, "/v1/admin/producers", None).await;
    let text = list.to_string();
    assert!(
        !text.contains(&rotated) && !text.contains(&rotated[16..]),
        "{text}"
    );
    assert!(!text.contains("sha256"), "{text}");

    // Only the accepted events reached the receiver; refusals are counted.
    let hook = &h.hook("hook").receiver;
    assert!(
        eventually(T, || hook.count() == 3).await,
        "{}",
        hook.count()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hook.count(), 3);
    let metrics = admin_metrics(&h).await;
    for reason in [
        "missing-token",
        "malformed-token",
        "unknown-token",
        "revoked-token",
        "out-of-scope",
    ] {
        let line =
            format!("outboxd_requests_refused_total{{endpoint=\"events\",reason=\"{reason}\"}}");
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with(&line) && !l.ends_with(" 0")),
            "{reason}:\n{metrics}"
        );
    }
    assert!(
        metrics.contains("outboxd_producer_events_total{producer=\"billing\"} 2"),
        "{metrics}"
    );
    h.daemon.stop().await;
    db.cleanup().await;
}

/// `/metrics`, with the admin token.
async fn admin_metrics(h: &Harness) -> String {
    let d = &h.daemon;
    d.http
        .get(format!("{}/metrics", d.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn a_producer_over_its_rate_is_answered_429_with_retry_after(backend: Backend) {
    let db = TestDb::new(backend).await;
    let h = daemon(&db, |c| {
        c.ingest.max_batch_items = 10;
        c.ingest.max_body_bytes = 4096;
    })
    .await;
    let slow = producer(&h, json!({"name": "slow", "rate_per_second": 1})).await;
    let batch = |from: usize| {
        Value::Array(
            (from..from + 10)
                .map(|i| event(&format!("r{i}"), "s", "t", json!({})))
                .collect(),
        )
    };
    // The burst is the largest batch ingest accepts; the next one waits.
    let (status, _, body) = post(&h, Some(&bearer(&slow)), &batch(0)).await;
    assert_eq!(status, 201, "{body}");
    let before = stored(&db).await;
    let (status, retry, body) = post(&h, Some(&bearer(&slow)), &batch(10)).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("rate-limited")),
        "{body}"
    );
    let retry: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((1..=10).contains(&retry), "Retry-After {retry}");
    assert_eq!(stored(&db).await, before);

    // Bytes per second: a body within the cap passes, the next is refused.
    let heavy = producer(&h, json!({"name": "heavy", "bytes_per_second": 100})).await;
    let big = |id: &str| event(id, "s", "t", json!({"pad": "x".repeat(3000)}));
    let (status, _, body) = post(&h, Some(&bearer(&heavy)), &big("h1")).await;
    assert_eq!(status, 201, "{body}");
    let before = stored(&db).await;
    let (status, retry, body) = post(&h, Some(&bearer(&heavy)), &big("h2")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("rate-limited")),
        "{body}"
    );
    assert!(retry.is_some());
    assert_eq!(stored(&db).await, before);
    h.daemon.stop().await;
    db.cleanup().await;
}

/// The awareness-compatible `/ingest` keeps its shared secret and also
/// takes a producer token, checked by the same gate (scope included).
async fn the_awareness_ingest_takes_a_producer_token_in_place_of_its_secret(backend: Backend) {
    let db = TestDb::new(backend).await;
    let h = daemon(&db, |c| {
        c.ingest.awareness =
            Some(serde_json::from_value(json!({"secret": "shared-secret"})).unwrap());
    })
    .await;
    let vault = producer(
        &h,
        json!({"name": "vault-1", "scope": {"types": ["awareness.*"]}}),
    )
    .await;
    let narrow = producer(
        &h,
        json!({"name": "narrow", "scope": {"types": ["other.*"]}}),
    )
    .await;
    let body = |event: &str, version: u64| {
        json!({
            "eventId": event, "id": "packet-1", "w3id": "@owner-1",
            "evaultPublicKey": "z6Mk-test-key", "data": {"n": 1},
            "schemaId": "550e8400-e29b-41d4-a716-446655440000", "operation": "create",
            "requestingPlatform": "https://pictique.example",
            "occurredAt": "2026-12-01T10:00:00.000Z", "streamVersion": version
        })
    };
    let send = |auth: Option<String>, secret: Option<&'static str>, body: Value| {
        let d = &h.daemon;
        let mut r = d
            .http
            .post(format!("{}/ingest", d.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(auth) = auth {
            r = r.header("authorization", auth);
        }
        if let Some(secret) = secret {
            r = r.header("x-ingest-secret", secret);
        }
        async move {
            let r = r.send().await.unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let before = stored(&db).await;
    // Neither, a wrong token (even beside the right secret), out of scope.
    assert_eq!(send(None, None, body("a1", 1)).await.0, 401);
    let forged = format!("Bearer {}x", &vault[..vault.len() - 1]);
    assert_eq!(
        send(Some(forged), Some("shared-secret"), body("a1", 1))
            .await
            .0,
        401
    );
    let (status, answer) = send(Some(bearer(&narrow)), None, body("a1", 1)).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (403, Some("out-of-scope")),
        "{answer}"
    );
    assert_eq!(stored(&db).await, before);
    // The secret alone, as the service's producers send it; a token alone.
    assert_eq!(
        send(None, Some("shared-secret"), body("a1", 1)).await.0,
        200
    );
    let (status, answer) = send(Some(bearer(&vault)), None, body("a2", 2)).await;
    assert_eq!(status, 200, "{answer}");
    let (_, view) = admin(&h, reqwest::Method::GET, "/v1/admin/events/a2", None).await;
    assert_eq!(view["producer"], "vault-1", "{view}");
    let (_, view) = admin(&h, reqwest::Method::GET, "/v1/admin/events/a1", None).await;
    assert_eq!(view["producer"], Value::Null, "{view}");
    h.daemon.stop().await;
    db.cleanup().await;
}

both_stores!(
    the_awareness_ingest_takes_a_producer_token_in_place_of_its_secret,
    hostile_requests_store_nothing_and_accepted_ones_name_their_producer,
    a_producer_over_its_rate_is_answered_429_with_retry_after,
);

#[test]
fn beyond_loopback_without_producer_auth_the_daemon_refuses_to_start() {
    let mut config = outboxd::config::Config {
        listen: "0.0.0.0:8080".parse().unwrap(),
        ..Default::default()
    };
    config.admin.token = Some(ADMIN.into());
    let e = config.validate().unwrap_err().to_string();
    assert!(
        e.contains("producers.auth") && e.contains("OUTBOXD_PRODUCERS__AUTH"),
        "{e}"
    );
    config.producers.auth = Some(ProducerAuth::Required);
    config.validate().unwrap();
    // The explicit opt-out for a trusted network starts (with a warning).
    config.producers.auth = Some(ProducerAuth::Optional);
    config.validate().unwrap();
    // On loopback, anonymous posts stay the default.
    let local = outboxd::config::Config::default();
    local.validate().unwrap();
    assert!(!local.metrics_require_token());
    assert!(config.metrics_require_token());
}

#[test]
fn the_deploy_files_for_a_network_load_with_producers_required() {
    for file in ["deploy/postgres.toml", "deploy/replicas.toml"] {
        let path = common::repo_root().join(file);
        let config = outboxd::config::Config::load(Some(&path), json!({"admin": {"token": ADMIN}}))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(
            config.producers.auth,
            Some(ProducerAuth::Required),
            "{file}"
        );
        assert!(!config.listen.ip().is_loopback(), "{file}");
        assert!(config.metrics_require_token(), "{file}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_can_require_the_admin_token() {
    let db = TestDb::new(Backend::Sqlite).await;
    let h = daemon(&db, |c| c.metrics.require_token = Some(true)).await;
    let (status, _) = h.daemon.get("/metrics").await;
    assert_eq!(status, 401);
    assert!(admin_metrics(&h)
        .await
        .contains("outboxd_requests_refused_total{endpoint=\"metrics\""));
    h.daemon.stop().await;
}
