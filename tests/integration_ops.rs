//! Operations: metrics a real Prometheus parser reads and that move as
//! events flow, readiness that sees a failing loop, pause/resume, dead
//! letter replay, and the admin token.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

fn sample(metrics: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metrics
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(ref h) => {
                h.iter().map(|b| b.count).fold(0.0, f64::max)
            }
            _ => f64::NAN,
        })
}

async fn scrape(d: &TestDaemon) -> prometheus_parse::Scrape {
    let text = d.metrics_text().await;
    let lines = text.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("metrics parse as Prometheus text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fresh_daemon_shows_every_known_series_at_zero_on_its_first_scrape() {
    let (d, _plugins) = Harness::new()
        .plugins(|plugins| {
            plugins.add_webhook(
                "webhook",
                "http://127.0.0.1:9/hook",
                &["http://127.0.0.1:9".to_string()],
                &new_secret(),
                "",
            )
        })
        .start()
        .await
        .into_daemon();
    // The very first scrape, before any delivery loop has had a turn.
    let first = scrape(&d).await;
    for outcome in outboxd::metrics::INGEST_OUTCOMES {
        assert_eq!(
            sample(
                &first,
                "outboxd_events_ingested_total",
                &[("outcome", outcome)]
            ),
            Some(0.0),
            "events_ingested_total{{outcome={outcome:?}}}"
        );
    }
    for outcome in outboxd::metrics::DELIVERY_OUTCOMES {
        assert_eq!(
            sample(
                &first,
                "outboxd_deliveries_total",
                &[("sink", "webhook"), ("outcome", outcome)]
            ),
            Some(0.0),
            "deliveries_total{{sink=\"webhook\", outcome={outcome:?}}}"
        );
    }
    for fill in outboxd::metrics::CLAIM_FILLS {
        assert!(
            sample(
                &first,
                "outboxd_claims_total",
                &[("sink", "webhook"), ("fill", fill)]
            )
            .is_some(),
            "claims_total{{sink=\"webhook\", fill={fill:?}}} on the first scrape"
        );
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_parse_and_move_as_events_flow() {
    let (d, receiver, _plugins) = Harness::new().webhook("webhook", "").start().await.single();
    let before = scrape(&d).await;
    assert_eq!(
        sample(
            &before,
            "outboxd_plugin_loads_total",
            &[("plugin", "webhook")]
        ),
        Some(1.0)
    );
    // The daemon's instance pool: its slots, none in use while idle.
    assert_eq!(
        sample(&before, "outboxd_plugin_pool_slots", &[]),
        Some(32.0)
    );
    assert_eq!(
        sample(&before, "outboxd_plugin_pool_instances", &[]),
        Some(0.0)
    );
    // Known label values are present at 0 before anything happens, so a
    // rate() or an alert sees the series on a fresh daemon.
    for outcome in ["stored", "duplicate", "conflict", "rejected"] {
        assert_eq!(
            sample(
                &before,
                "outboxd_events_ingested_total",
                &[("outcome", outcome)]
            ),
            Some(0.0),
            "events_ingested_total{{outcome={outcome:?}}} on a fresh daemon"
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = scrape(&d).await;
        let zero = |outcome| {
            sample(
                &now,
                "outboxd_deliveries_total",
                &[("sink", "webhook"), ("outcome", outcome)],
            ) == Some(0.0)
        };
        if zero("delivered") && zero("retry") && zero("dead") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "deliveries_total for sink webhook not present at 0 once its loop runs"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let batch: Vec<_> = (0..5)
        .map(|i| event(&format!("m{i}"), "s", "t", json!({"i": i})))
        .collect();
    d.post_batch(&batch).await;
    // The same event again: a duplicate, answered 200.
    let (status, body) = d
        .post(
            "application/cloudevents+json",
            serde_json::to_vec(&batch[0]).unwrap(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["duplicate"], true, "{body}");
    d.post("application/cloudevents+json", "{").await; // rejected
    assert!(eventually(Duration::from_secs(20), || receiver.seen().len() >= 5).await);
    d.wait_delivery("m4", Duration::from_secs(10), |x| {
        x["status"] == "delivered"
    })
    .await;

    let after = scrape(&d).await;
    assert_eq!(
        sample(
            &after,
            "outboxd_events_ingested_total",
            &[("outcome", "stored")]
        ),
        Some(5.0)
    );
    assert_eq!(
        sample(
            &after,
            "outboxd_events_ingested_total",
            &[("outcome", "duplicate")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &after,
            "outboxd_events_ingested_total",
            &[("outcome", "rejected")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &after,
            "outboxd_deliveries_total",
            &[("sink", "webhook"), ("outcome", "delivered")]
        ),
        Some(5.0),
        "deliveries counted as the receiver saw them"
    );
    assert_eq!(
        sample(
            &after,
            "outboxd_queue_depth",
            &[("sink", "webhook"), ("status", "pending")]
        ),
        Some(0.0)
    );
    assert!(
        sample(
            &after,
            "outboxd_worker_heartbeat_age_seconds",
            &[("sink", "webhook")]
        )
        .unwrap()
            < 5.0
    );
    assert!(after
        .samples
        .iter()
        .any(|s| s.metric.starts_with("outboxd_delivery_latency_seconds")));
    // Five events, batches of up to 100: their claims came back short.
    let short = sample(
        &after,
        "outboxd_claims_total",
        &[("sink", "webhook"), ("fill", "short")],
    );
    assert!(short >= Some(1.0), "claims_total short: {short:?}");
    assert_eq!(
        sample(
            &after,
            "outboxd_claims_total",
            &[("sink", "webhook"), ("fill", "full")]
        ),
        Some(0.0),
        "no claim came back full"
    );
    // The messaging semantic conventions' families, beside ours.
    let messaging = |name: &str, operation: &str, destination: &str| {
        sample(
            &after,
            name,
            &[
                ("messaging_system", "outboxd"),
                ("messaging_operation_name", operation),
                ("messaging_destination_name", destination),
            ],
        )
    };
    assert_eq!(
        messaging("messaging_client_sent_messages_total", "send", ""),
        Some(5.0),
        "events stored by ingest"
    );
    assert_eq!(
        messaging(
            "messaging_client_consumed_messages_total",
            "receive",
            "webhook"
        ),
        Some(5.0),
        "deliveries claimed by the webhook sink"
    );
    for (name, operation, destination) in [
        ("messaging_client_operation_duration_seconds", "send", ""),
        (
            "messaging_client_operation_duration_seconds",
            "receive",
            "webhook",
        ),
        ("messaging_process_duration_seconds", "process", "webhook"),
    ] {
        let count = messaging(name, operation, destination);
        assert!(count >= Some(1.0), "{name} {operation}: {count:?}");
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_sink_delivers_nothing_until_resumed() {
    let (d, receiver, _plugins) = Harness::new().webhook("webhook", "").start().await.single();
    let r = d
        .http
        .post(format!("{}/v1/admin/sinks/webhook/pause", d.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Every loop reads the pause within 1 s (PAUSE_RECHECK) plus one idle sleep.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for i in 0..3 {
        d.post_event(&event(&format!("p{i}"), "s", "t", json!({})))
            .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(receiver.seen().is_empty(), "nothing delivered while paused");
    assert_eq!(
        d.deliveries("p0").await[0]["status"],
        "pending",
        "nothing lost"
    );
    let r = d
        .http
        .post(format!("{}/v1/admin/sinks/webhook/resume", d.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        eventually(Duration::from_secs(20), || receiver.seen().len() == 3).await,
        "everything after resume"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_dead_letter_is_delivered() {
    let (d, receiver, _plugins) = Harness::new().webhook("webhook", "").start().await.single();
    receiver.script(400, &[], "not today");
    d.post_event(&event("dl", "s", "t", json!({}))).await;
    d.wait_delivery("dl", Duration::from_secs(20), |x| x["status"] == "dead")
        .await;
    let listed: serde_json::Value = d
        .http
        .get(format!("{}/v1/admin/dead?sink=webhook", d.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["dead"][0]["event_id"], "dl");
    assert!(listed["dead"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("400"));
    let r: serde_json::Value = d
        .http
        .post(format!("{}/v1/admin/dead/replay", d.base))
        .json(&json!({"event_id": "dl"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["replayed"], 1);
    let done = d
        .wait_delivery("dl", Duration::from_secs(20), |x| {
            x["status"] == "delivered"
        })
        .await;
    assert_eq!(done["attempts"], 1, "a replay starts the attempts afresh");
    assert!(
        done["last_error"].is_null(),
        "a delivered replay shows no old error: {done}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocking_sink_holds_the_stream_behind_a_dead_letter_until_it_is_replayed() {
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .plugins(|plugins| {
            let manifest = plugins.path().join("webhook.toml");
            let text = std::fs::read_to_string(&manifest).unwrap();
            std::fs::write(
                &manifest,
                text.replace("[retry]\n", "[retry]\non-dead = \"block\"\n"),
            )
            .unwrap();
        })
        .start()
        .await
        .single();
    receiver.script(400, &[], "not today");
    for id in ["b1", "b2"] {
        d.post_event(&event(id, "s", "t", json!({}))).await;
    }
    d.wait_delivery("b1", Duration::from_secs(20), |x| x["status"] == "dead")
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b2 = d.delivery("b2", "webhook").await.unwrap();
    assert_eq!(b2["status"], "pending", "{b2}");
    assert_eq!(b2["attempts"], 0, "b2 waits behind the dead letter: {b2}");
    assert_eq!(receiver.count(), 1, "only b1 was tried");

    let (status, _) = {
        let r = d
            .http
            .post(format!("{}/v1/admin/dead/replay", d.base))
            .json(&json!({"event_id": "b1"}))
            .send()
            .await
            .unwrap();
        (r.status(), ())
    };
    assert_eq!(status, 200);
    d.wait_delivery("b2", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    let order: Vec<String> = receiver
        .seen()
        .iter()
        .map(|r| r.header("ce-id").unwrap())
        .collect();
    assert_eq!(order, ["b1", "b1", "b2"], "the replayed letter goes first");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_api_wants_its_token() {
    let Harness {
        daemon: d,
        plugins: _plugins,
        ..
    } = Harness::new()
        .config(|c| c.admin.token = Some("s3cret".into()))
        .start()
        .await;
    let url = format!("{}/v1/admin/sinks", d.base);
    assert_eq!(
        d.http.get(&url).send().await.unwrap().status(),
        401,
        "no token"
    );
    assert_eq!(
        d.http
            .get(&url)
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap()
            .status(),
        401,
        "wrong token"
    );
    assert_eq!(
        d.http
            .get(&url)
            .bearer_auth("s3cret")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // The ingest API and probes do not need it.
    assert_eq!(d.get("/health").await.0, 200);
    d.stop().await;

    // Listening beyond loopback without a token is refused at start.
    let config = outboxd::config::Config {
        listen: "0.0.0.0:0".parse().unwrap(),
        ..Default::default()
    };
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("admin.token"), "{err}");
}

/// A loop whose every claim fails keeps turning (health 200) but is not
/// ready; when the claims work again, it is ready and delivers. A claim
/// locks and leases deliveries, so it needs UPDATE on them; an ingest only
/// inserts them, so events are still taken while claims fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ready_is_503_while_every_claim_fails() {
    use sqlx::Connection;
    let db = TestDb::new(Backend::Postgres).await;
    let _ = db.store().await;
    let role = format!("outboxd_r_{}", hex::encode(rand::random::<[u8; 4]>()));
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT USAGE ON SCHEMA outboxd TO {role}"),
        format!("GRANT ALL ON ALL TABLES IN SCHEMA outboxd TO {role}"),
        format!("GRANT ALL ON ALL SEQUENCES IN SCHEMA outboxd TO {role}"),
        format!("GRANT SELECT ON _sqlx_migrations TO {role}"),
    ] {
        sqlx::query(&sql).execute(&mut admin).await.unwrap();
    }
    let url = db.url.replacen("postgres@", &format!("{role}@"), 1);
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .config(move |c| c.database_url = Some(url))
        .start()
        .await
        .single();
    d.post_event(&event("r1", "s", "t", json!({}))).await;
    assert!(eventually(Duration::from_secs(10), || !receiver.seen().is_empty()).await);
    let (status, body) = d.get("/ready").await;
    assert_eq!(status, 200, "{body}");

    sqlx::query(&format!("REVOKE UPDATE ON outboxd.deliveries FROM {role}"))
        .execute(&mut admin)
        .await
        .unwrap();
    d.post_event(&event("r2", "s", "t", json!({}))).await;
    let start = std::time::Instant::now();
    loop {
        let (status, body) = d.get("/ready").await;
        if status == 503 {
            assert_eq!(body["checks"]["workers"]["ok"], false, "{body}");
            assert_eq!(body["checks"]["database"]["ok"], true, "{body}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "still ready while claims fail: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(d.get("/health").await.0, 200, "the loop is still turning");

    sqlx::query(&format!("GRANT UPDATE ON outboxd.deliveries TO {role}"))
        .execute(&mut admin)
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || receiver.seen().len() >= 2).await,
        "delivers again without a restart"
    );
    let start = std::time::Instant::now();
    while d.get("/ready").await.0 != 200 {
        assert!(start.elapsed() < Duration::from_secs(15), "not ready again");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    d.stop().await;
    drop(admin);
    db.cleanup().await;
    if let Ok(mut a) = sqlx::PgConnection::connect(&pg_admin_url()).await {
        let _ = sqlx::query(&format!("DROP ROLE IF EXISTS {role}"))
            .execute(&mut a)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backfill_gives_a_new_sink_the_past_events_once() {
    let db = TestDb::new(Backend::Sqlite).await;
    let new = Receiver::start().await;
    let url = db.url.clone();
    let first_url = url.clone();
    let (d, old, plugins) = Harness::new()
        .webhook("a", "")
        .config(move |c| c.database_url = Some(first_url))
        .start()
        .await
        .single();
    let batch: Vec<_> = (0..6)
        .map(|i| {
            event(
                &format!("b{i}"),
                &format!("s{}", i % 2),
                "t",
                json!({"i": i}),
            )
        })
        .collect();
    d.post_batch(&batch).await;
    assert!(eventually(Duration::from_secs(20), || old.seen().len() == 6).await);
    d.stop().await;

    // A new sink appears; past events have no delivery for it yet.
    let wasm = plugins.path().join("webhook.wasm");
    let manifest = std::fs::read_to_string(plugins.path().join("a.toml")).unwrap();
    let manifest = manifest
        .replace("name = \"a\"", "name = \"b\"")
        .replace(&old.url(), &new.url())
        .replace(&old.origin(), &new.origin());
    std::fs::write(plugins.path().join("b.toml"), manifest).unwrap();
    assert!(wasm.exists());
    let d = TestDaemon::start_with(plugins.path(), |c| c.database_url = Some(url.clone())).await;
    let body = json!({"sink": "b"});
    let first: serde_json::Value = d
        .http
        .post(format!("{}/v1/admin/backfill", d.base))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(first["created"], 6, "{first}");
    let second: serde_json::Value = d
        .http
        .post(format!("{}/v1/admin/backfill", d.base))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        second["created"], 0,
        "running it twice creates nothing new: {second}"
    );
    assert!(eventually(Duration::from_secs(20), || new.seen().len() == 6).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(new.seen().len(), 6);
    assert_eq!(old.seen().len(), 6, "the old sink got nothing twice");
    // Per-stream order at the new sink.
    let mut last = std::collections::BTreeMap::new();
    for r in new.seen() {
        let seq: u64 = r.header("ce-sequence").unwrap().parse().unwrap();
        let prev = last
            .insert(r.header("ce-partitionkey").unwrap(), seq)
            .unwrap_or(0);
        assert!(seq > prev);
    }
    d.stop().await;
}

/// Wait for `/ready` to answer `want`; the last body on timeout.
async fn wait_ready(d: &TestDaemon, want: u16, timeout: Duration) -> serde_json::Value {
    let start = std::time::Instant::now();
    loop {
        let (status, body) = d.get("/ready").await;
        if status == want {
            return body;
        }
        assert!(
            start.elapsed() < timeout,
            "/ready stayed {status} (wanted {want}) for {timeout:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ready_follows_postgresql_down_and_back_and_delivery_resumes_without_a_restart() {
    let pg = PrivatePostgres::init();
    let url = pg.url();
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .config(move |c| c.database_url = Some(url))
        .start()
        .await
        .single();
    let post = |id: &'static str| {
        let body = serde_json::to_vec(&event(id, "s", "t", json!({}))).unwrap();
        let d = &d;
        async move { d.post("application/cloudevents+json", body).await }
    };
    assert_eq!(post("before").await.0, 201);
    assert!(eventually(Duration::from_secs(15), || receiver.count() == 1).await);
    wait_ready(&d, 200, Duration::from_secs(15)).await;

    pg.stop();
    let down = wait_ready(&d, 503, Duration::from_secs(15)).await;
    assert_eq!(down["checks"]["database"]["ok"], false, "{down}");
    let (status, body) = post("during").await;
    assert!(
        status >= 500,
        "ingest with the database down: {status} {body}"
    );

    pg.start();
    wait_ready(&d, 200, Duration::from_secs(30)).await;
    assert_eq!(post("after").await.0, 201);
    assert!(
        eventually(Duration::from_secs(30), || receiver.count() == 2).await,
        "delivery did not resume: {} requests",
        receiver.count()
    );
    let ids: Vec<String> = receiver
        .seen()
        .iter()
        .map(|r| r.header("ce-id").unwrap())
        .collect();
    assert_eq!(ids, ["before", "after"]);
    d.stop().await;
}
