//! The walking skeleton end to end: HTTP ingest → SQLite → the WebAssembly
//! `webhook` sink → a real HTTP receiver on loopback.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_event_arrives_once_in_stream_order_with_cloudevents_headers_and_a_valid_signature() {
    let (
        d,
        Hook {
            receiver, secret, ..
        },
        _plugins,
    ) = Harness::new()
        .webhook("webhook", "")
        .start()
        .await
        .single_hook();

    let mut sent = Vec::new();
    for round in 0..5 {
        let batch: Vec<_> = ["orders/1", "orders/2", "users/7"]
            .iter()
            .map(|stream| {
                let id = format!("{stream}-{round}");
                sent.push((id.clone(), stream.to_string()));
                event(
                    &id,
                    stream,
                    "com.example.changed",
                    json!({"round": round, "stream": stream}),
                )
            })
            .collect();
        let body = d.post_batch(&batch).await;
        assert_eq!(body["events"].as_array().unwrap().len(), 3);
    }
    // One single-event post too, with a subject and an extension.
    let mut single = event(
        "single-1",
        "users/7",
        "com.example.renamed",
        json!({"name": "Ünïcode ✓"}),
    );
    single["subject"] = json!("users/7/name");
    single["traceparent"] = json!("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    let body = d.post_event(&single).await;
    assert_eq!(body["sequence"], 6);
    assert_eq!(body["duplicate"], false);
    sent.push(("single-1".into(), "users/7".into()));

    assert!(
        eventually(Duration::from_secs(20), || receiver.seen().len()
            >= sent.len())
        .await,
        "not all delivered"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = receiver.seen();
    assert_eq!(seen.len(), sent.len(), "each event exactly once");

    let mut last_seq: BTreeMap<String, u64> = BTreeMap::new();
    for r in &seen {
        assert!(
            verify_signature(&secret, r),
            "signature must verify: {:?}",
            r.headers
        );
        assert_eq!(r.header("ce-specversion").as_deref(), Some("1.0"));
        assert_eq!(
            r.header("ce-source").as_deref(),
            Some("https://example.com/tests")
        );
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/json")
        );
        let id = r.header("ce-id").unwrap();
        assert_eq!(r.header("webhook-id").as_deref(), Some(id.as_str()));
        let stream = r.header("ce-partitionkey").unwrap();
        let seq: u64 = r.header("ce-sequence").unwrap().parse().unwrap();
        assert!(r.header("ce-time").is_some());
        let prev = last_seq.insert(stream.clone(), seq).unwrap_or(0);
        assert!(seq > prev, "stream {stream} went from {prev} to {seq}");
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        if id == "single-1" {
            assert_eq!(body, json!({"name": "Ünïcode ✓"}));
            assert_eq!(r.header("ce-type").as_deref(), Some("com.example.renamed"));
            assert_eq!(r.header("ce-subject").as_deref(), Some("users/7/name"));
            assert_eq!(
                r.header("ce-traceparent").as_deref(),
                Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            );
            // With tracing off the attempt's context is the event's
            // creation context (`trace.traceparents`), sent on as W3C's.
            assert_eq!(
                r.header("traceparent").as_deref(),
                Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            );
        } else {
            assert_eq!(body["stream"], json!(stream));
            assert_eq!(r.header("traceparent"), None, "{id} has no context");
        }
    }
    assert_eq!(last_seq.len(), 3);
    let delivered = d.deliveries("single-1").await;
    assert_eq!(delivered[0]["status"], "delivered");
    assert_eq!(delivered[0]["attempts"], 1);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_503_twice_then_200_is_delivered_on_the_third_attempt() {
    let (d, receiver, _plugins) = Harness::new().webhook("webhook", "").start().await.single();
    receiver.script(503, &[], "busy");
    receiver.script(503, &[], "still busy");

    d.post_event(&event("r-1", "s", "t", json!({"n": 1}))).await;
    let done = d
        .wait_delivery("r-1", Duration::from_secs(20), |x| {
            x["status"] == "delivered"
        })
        .await;
    assert_eq!(done["attempts"], 3, "{done}");
    assert_eq!(receiver.seen().len(), 3);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_400_dead_letters_the_delivery_with_the_status_in_its_reason() {
    let (d, receiver, _plugins) = Harness::new().webhook("webhook", "").start().await.single();
    receiver.script(400, &[], "schema mismatch: field x");

    d.post_event(&event("x-1", "s", "t", json!({}))).await;
    let dead = d
        .wait_delivery("x-1", Duration::from_secs(20), |x| x["status"] == "dead")
        .await;
    let reason = dead["last_error"].as_str().unwrap();
    assert!(reason.contains("400"), "{reason}");
    assert!(reason.contains("schema mismatch"), "{reason}");
    assert_eq!(dead["attempts"], 1);

    // The stream moves on past a dead delivery (the default policy).
    d.post_event(&event("x-2", "s", "t", json!({}))).await;
    d.wait_delivery("x-2", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    d.stop().await;
}

/// Every POST states its body's length: without `content-length`,
/// `wasi:http` sends the body chunked, and a receiver that reads only
/// Content-Length bodies would see an empty POST it may still answer 200.
/// Both payload modes (CloudEvents binary, awareness JSON).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_post_carries_a_content_length_equal_to_its_body() {
    let h = Harness::new()
        .webhook("cloudevents", "")
        .webhook("awareness", "payload = \"awareness\"\n")
        .start()
        .await;
    let d = &h.daemon;
    for (i, data) in [json!({}), json!({"n": 1, "text": "Ünïcode ✓ ".repeat(500)})]
        .into_iter()
        .enumerate()
    {
        let mut e = event(&format!("len-{i}"), "s", "t", data);
        // What the awareness payload is built from.
        e["w3id"] = json!("@owner-1");
        e["schemaid"] = json!("550e8400-e29b-41d4-a716-446655440000");
        e["operation"] = json!("update");
        d.post_event(&e).await;
    }
    for name in ["cloudevents", "awareness"] {
        let receiver = &h.hook(name).receiver;
        assert!(
            eventually(Duration::from_secs(20), || receiver.count() >= 2).await,
            "{name}: not delivered"
        );
        for r in receiver.seen() {
            assert!(!r.body.is_empty(), "{name}: an empty body: {r:?}");
            assert_eq!(
                r.header("content-length"),
                Some(r.body.len().to_string()),
                "{name}: {r:?}"
            );
            assert_eq!(r.header("transfer-encoding"), None, "{name}: {r:?}");
        }
    }
    h.daemon.stop().await;
}

/// A refused connection is named in the delivery's reason as the WIT
/// spells the code (`connection-refused`), never as Rust debug text.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_connection_is_named_by_its_wit_code_in_the_reason() {
    // A loopback port nothing listens on, granted to the sink.
    let closed = free_loopback_addr();
    let plugins = PluginsDir::new();
    plugins.add_webhook(
        "webhook",
        &format!("http://{closed}/hook"),
        &[format!("http://{closed}")],
        &new_secret(),
        "",
    );
    let d = TestDaemon::start(plugins.path()).await;
    d.post_event(&event("refused-1", "s", "t", json!({}))).await;
    let state = d
        .wait_delivery("refused-1", Duration::from_secs(20), |x| {
            !x["last_error"].is_null()
        })
        .await;
    let reason = state["last_error"].as_str().unwrap();
    assert!(
        reason.contains("connection refused (connection-refused)"),
        "{reason}"
    );
    assert!(!reason.contains("ErrorCode"), "{reason}");
    assert_ne!(state["status"], "dead", "a refused connection is retried");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sink_allowed_host_a_cannot_reach_host_b() {
    let allowed = Receiver::start().await;
    // Allowed to call `allowed`, configured to call `other`.
    let (d, other, _plugins) = Harness::new()
        .webhook_allowing("webhook", &[allowed.origin()])
        .start()
        .await
        .single();

    d.post_event(&event("e-1", "s", "t", json!({}))).await;
    let state = d
        .wait_delivery("e-1", Duration::from_secs(20), |x| {
            x["attempts"].as_u64().unwrap_or(0) >= 1 && !x["last_error"].is_null()
        })
        .await;
    assert_ne!(state["status"], "delivered");
    let reason = state["last_error"].as_str().unwrap();
    assert!(
        reason.contains("denied"),
        "reason should say the request was denied: {reason}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(other.seen().is_empty(), "host B must never be reached");
    assert!(allowed.seen().is_empty());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_is_a_4xx_naming_the_field_and_stores_nothing() {
    let Harness {
        daemon: d,
        plugins: _plugins,
        ..
    } = Harness::new().start().await;

    let (status, body) = d.post("application/cloudevents+json", "{not json").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "body");

    for missing in ["id", "source", "type", "specversion"] {
        let mut ev = event("bad-1", "s", "t", json!({}));
        ev.as_object_mut().unwrap().remove(missing);
        let (status, body) = d
            .post(
                "application/cloudevents+json",
                serde_json::to_vec(&ev).unwrap(),
            )
            .await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["field"], missing, "{body}");
        assert!(body["error"].as_str().unwrap().contains(missing));
    }

    let (status, body) = d
        .post(
            "text/plain",
            serde_json::to_vec(&event("bad-1", "s", "t", json!({}))).unwrap(),
        )
        .await;
    assert_eq!(status, 415, "{body}");
    assert_eq!(body["field"], "content-type");

    // A batch with one bad item stores none of its items.
    let batch = json!([event("good-1", "s", "t", json!({})), {"specversion": "1.0", "id": "bad-2", "source": "s"}]);
    let (status, body) = d
        .post(
            "application/cloudevents-batch+json",
            serde_json::to_vec(&batch).unwrap(),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "[1].type");

    for id in ["bad-1", "bad-2", "good-1"] {
        let (status, _) = d.get(&format!("/v1/events/{id}")).await;
        assert_eq!(status, 404, "{id} must not be stored");
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broken_plugins_are_refused_with_their_file_named_and_the_good_one_keeps_delivering() {
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .plugins(|plugins| {
            // Not a component at all.
            plugins.write("garbage.wasm", b"this is not webassembly");
            plugins.write(
                "garbage.toml",
                b"name = \"garbage\"\nversion = \"1\"\nwit = \"outboxd:sink@0.1.0\"\n",
            );
            // A component that exports nothing: no `deliver`.
            plugins.write("empty.wasm", &wat::parse_str("(component)").unwrap());
            plugins.write(
                "empty.toml",
                b"name = \"empty\"\nversion = \"1\"\nwit = \"outboxd:sink@0.1.0\"\n",
            );
        })
        .start()
        .await
        .single();

    let (status, ready) = d.get("/ready").await;
    assert_eq!(
        status, 503,
        "refused plugins make the daemon not ready: {ready}"
    );
    let refused = ready["checks"]["plugins"]["refused"].to_string();
    assert!(
        refused.contains("garbage.wasm") && refused.contains("not a WebAssembly file"),
        "{refused}"
    );
    assert!(
        refused.contains("empty.wasm") && refused.contains("deliver"),
        "{refused}"
    );
    assert_eq!(ready["checks"]["plugins"]["loaded"], json!(["webhook"]));

    d.post_event(&event("g-1", "s", "t", json!({}))).await;
    d.wait_sink("g-1", "webhook", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    assert_eq!(receiver.count(), 1);
    // Deliveries to the refused sinks wait (they are routed, not lost).
    let deliveries = d.deliveries("g-1").await;
    assert_eq!(deliveries.len(), 3, "{deliveries:?}");
    for x in &deliveries {
        if x["sink"] == "webhook" {
            continue;
        }
        assert_eq!(x["status"], "pending", "{x}");
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_is_honoured_the_window_dead_letters_and_a_replay_delivers() {
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .plugins(|plugins| {
            let manifest = plugins.path().join("webhook.toml");
            let text = std::fs::read_to_string(&manifest)
                .unwrap()
                .replace("cap = \"1s\"\n", "cap = \"1s\"\nwindow = \"4s\"\n");
            std::fs::write(&manifest, text).unwrap();
        })
        .start()
        .await
        .single();
    receiver.script(503, &[("retry-after", "2")], "busy");

    d.post_event(&event("ra", "s1", "t", json!({}))).await;
    d.wait_delivery("ra", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    let seen = receiver.seen();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_secs(2),
        "Retry-After: 2 honoured, next attempt after {gap:?}"
    );

    // Always 503 on another stream: the 4 s window runs out → dead.
    for _ in 0..100 {
        receiver.script(503, &[], "down");
    }
    d.post_event(&event("win", "s2", "t", json!({}))).await;
    let dead = d
        .wait_delivery("win", Duration::from_secs(30), |x| x["status"] == "dead")
        .await;
    let reason = dead["last_error"].as_str().unwrap();
    assert!(
        reason.contains("retry window") && reason.contains("HTTP 503"),
        "{reason}"
    );
    assert!(dead["attempts"].as_u64().unwrap() >= 2, "{dead}");

    receiver.clear_script();
    let r: serde_json::Value = d
        .http
        .post(format!("{}/v1/admin/dead/replay", d.base))
        .json(&json!({"sink": "webhook"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["replayed"], 1);
    d.wait_delivery("win", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wildcard_allow_list_does_not_reach_loopback_but_an_entry_naming_it_does() {
    init_logs();
    // `http://*:*` allows any host by name, but 127.0.0.1 is a loopback
    // address: only an entry naming it exactly (`named`'s own receiver's
    // origin, http://127.0.0.1:PORT) reaches it.
    let Harness {
        daemon: d,
        hooks,
        plugins: _plugins,
    } = Harness::new()
        .webhook_allowing("wildcard", &["http://*:*".to_string()])
        .webhook("named", "")
        .start()
        .await;
    let (receiver, named) = (&hooks[0].receiver, &hooks[1].receiver);
    assert_eq!(
        named.origin(),
        format!("http://127.0.0.1:{}", named.addr.port())
    );
    // The compiled component is kept under <data-dir>/cache/ (one file: both
    // sinks run the same component), so a restart does not compile again.
    let cached: Vec<_> = std::fs::read_dir(d.data.path().join("cache"))
        .expect("the daemon creates <data-dir>/cache/")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");

    d.post_event(&event("lo-1", "s", "t", json!({}))).await;
    let refused = d
        .wait_sink("lo-1", "wildcard", Duration::from_secs(20), |x| {
            x["attempts"].as_u64().unwrap_or(0) >= 1 && !x["last_error"].is_null()
        })
        .await;
    assert_ne!(refused["status"], "delivered");
    let reason = refused["last_error"].as_str().unwrap();
    assert!(
        reason.contains("denied by host policy"),
        "the reason says the host refused it: {reason}"
    );
    d.wait_sink("lo-1", "named", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        receiver.seen().is_empty(),
        "the wildcard sink must never reach loopback"
    );
    assert_eq!(named.seen().len(), 1);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_builtin_discard_sink_acknowledges_every_event_without_sending_it() {
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .plugins(|plugins| {
            plugins.write(
                "drain.toml",
                b"name = \"drain\"\nversion = \"1\"\nwit = \"outboxd:sink@0.1.0\"\nbuiltin = \"discard\"\n",
            );
        })
        .start()
        .await
        .single();
    let batch: Vec<_> = (0..5)
        .map(|i| event(&format!("d-{i}"), "s", "t", json!({ "i": i })))
        .collect();
    d.post_batch(&batch).await;
    for i in 0..5 {
        let done = d
            .wait_sink(&format!("d-{i}"), "drain", Duration::from_secs(10), |x| {
                x["status"] == "delivered"
            })
            .await;
        assert_eq!(done["attempts"], 1, "{done}");
    }
    // The webhook sink beside it got every event: the discard sink took
    // nothing from it.
    assert!(eventually(Duration::from_secs(10), || receiver.count() == 5).await);
    d.stop().await;
}

/// How many of the requests arrived within `window` of the first.
fn arrived_within(receiver: &Receiver, window: Duration) -> usize {
    receiver.with_seen(|seen| {
        let first = seen.iter().map(|r| r.at).min().expect("a request arrived");
        seen.iter().filter(|r| r.at < first + window).count()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_batch_is_claimed_while_the_first_is_delivered_unless_batches_in_flight_is_one() {
    // 100 events on 100 streams in one ingest, batches of 50 all sent at
    // once, a receiver holding each answer 600 ms: with two batches in
    // flight the second batch's requests arrive while the first's are
    // still held; with one, only after.
    init_logs();
    for (in_flight, expect_overlap) in [(2, true), (1, false)] {
        let (d, receiver, _plugins) = Harness::new()
            // The harness's sinks take batches of up to 50.
            .webhook("webhook", "max-concurrency = \"50\"\n")
            .config(move |c| c.delivery.batches_in_flight = in_flight)
            .start()
            .await
            .single();
        receiver.set_delay(Duration::from_millis(600));
        let batch: Vec<_> = (0..100)
            .map(|i| event(&format!("b{i}"), &format!("s{i}"), "t", json!({ "i": i })))
            .collect();
        let answer = d.post_batch(&batch).await;
        assert_eq!(
            answer["events"].as_array().map(Vec::len),
            Some(100),
            "{answer}"
        );
        assert!(
            eventually(Duration::from_secs(30), || receiver.count() >= 100).await,
            "batches-in-flight = {in_flight}: every event delivered ({} arrived)",
            receiver.count()
        );
        let early = arrived_within(&receiver, Duration::from_millis(300));
        if expect_overlap {
            assert!(
                early > 50,
                "two batches in flight: {early} requests within 300 ms of the first (one batch is 50)"
            );
        } else {
            assert_eq!(
                early, 50,
                "one batch in flight: the second batch waits for the first"
            );
        }
        d.stop().await;
    }
}

/// A batch is finished while its loop waits on the store for something
/// else. Two batches of 50 are in flight to a receiver holding each answer
/// 2 s; while both are held, another session locks `outboxd.sink_state`
/// (what the loop's pause read reads, at most once a second) and keeps it
/// locked for up to 10 s. When the first batch ends, the loop's next pause read
/// waits on that lock (up to `delivery.db-timeout`, 20 s here). The second
/// batch must still be finished — all 100 deliveries `delivered` — while
/// the lock is held: a turn run inside the loop's own future stands still
/// while the loop waits, and a turn in its finish holds its heads locked,
/// so an ingest of those streams would wait on it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_batch_is_finished_while_its_loop_waits_on_the_store() {
    use sqlx::Connection;
    init_logs();
    let db = TestDb::new(Backend::Postgres).await;
    let url = db.url.clone();
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "max-concurrency = \"50\"\n")
        .config(move |c| {
            c.database_url = Some(url);
            c.delivery.batches_in_flight = 2;
            c.delivery.db_timeout = Duration::from_secs(20);
        })
        .start()
        .await
        .single();
    receiver.set_delay(Duration::from_secs(2));
    let batch: Vec<_> = (0..100)
        .map(|i| event(&format!("h{i}"), &format!("s{i}"), "t", json!({ "i": i })))
        .collect();
    d.post_batch(&batch).await;
    assert!(
        eventually(Duration::from_secs(10), || receiver.count() >= 100).await,
        "both batches reach the receiver ({} requests)",
        receiver.count()
    );
    let held = HeldLocks::take(
        &db.url,
        "LOCK TABLE outboxd.sink_state IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    let locked = std::time::Instant::now();
    let mut watch = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut delivered = 0i64;
    while locked.elapsed() < Duration::from_secs(10) && delivered < 100 {
        delivered = sqlx::query_scalar(
            "SELECT count(*) FROM outboxd.deliveries WHERE status = 'delivered'",
        )
        .fetch_one(&mut watch)
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waited = locked.elapsed();
    held.release().await;
    assert_eq!(
        delivered, 100,
        "both batches finished while the loop's pause read waited on the lock \
         ({delivered} of 100 delivered after {waited:?})"
    );
    d.stop().await;
}

/// A pause read that waits on the store holds back one loop, not every
/// loop of the process. Three sinks, each with its own receiver, deliver a
/// first event; then another session locks `outboxd.sink_state` (what the
/// pause read reads) and keeps it for up to 8 s. Once the cached answer is
/// stale (1 s), a second event goes to all three sinks. The loop that reads
/// the store first waits on the lock; the other two must deliver the event
/// while the lock is held. With the read done under one shared lock, every
/// loop would wait for it and none would deliver before the lock went.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_pause_read_waiting_on_the_store_holds_back_one_loop_only() {
    init_logs();
    let db = TestDb::new(Backend::Postgres).await;
    let url = db.url.clone();
    let Harness {
        daemon: d,
        hooks,
        plugins: _plugins,
    } = Harness::new()
        .webhook("webhook0", "")
        .webhook("webhook1", "")
        .webhook("webhook2", "")
        .config(move |c| {
            c.database_url = Some(url);
            c.delivery.db_timeout = Duration::from_secs(20);
        })
        .start()
        .await;
    let receivers: Vec<&Receiver> = hooks.iter().map(|h| &h.receiver).collect();
    let arrived = |n: usize| receivers.iter().filter(|r| r.count() >= n).count();
    d.post_event(&event("p1", "s", "t", json!({ "i": 1 })))
        .await;
    assert!(
        eventually(Duration::from_secs(10), || arrived(1) == 3).await,
        "the first event reaches every receiver ({} of 3)",
        arrived(1)
    );
    let held = HeldLocks::take(
        &db.url,
        "LOCK TABLE outboxd.sink_state IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    let locked = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    d.post_event(&event("p2", "s", "t", json!({ "i": 2 })))
        .await;
    let two = eventually(Duration::from_secs(6), || arrived(2) >= 2).await;
    let (seen, waited) = (arrived(2), locked.elapsed());
    held.release().await;
    assert!(
        two,
        "the second event reached {seen} of 3 receivers while the pause read waited on the lock ({waited:?})"
    );
    assert!(
        eventually(Duration::from_secs(20), || arrived(2) == 3).await,
        "after the lock, every receiver has the second event ({} of 3)",
        arrived(2)
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_under_a_private_ca_is_reached_over_http2_once_egress_ca_file_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = private_ca();
    let (addr, seen) = https_receiver(dir.path(), (&cert, &key)).await;
    let origin = format!("https://{addr}");
    let plugins = PluginsDir::new();
    plugins.add_webhook(
        "webhook",
        &format!("{origin}/hook"),
        std::slice::from_ref(&origin),
        &new_secret(),
        "",
    );

    // The webpki roots alone do not trust it: retried, named, never sent.
    let d = TestDaemon::start(plugins.path()).await;
    d.post_event(&event("untrusted-1", "s", "t", json!({"n": 1})))
        .await;
    let state = d
        .wait_delivery("untrusted-1", Duration::from_secs(20), |x| {
            !x["last_error"].is_null()
        })
        .await;
    let reason = state["last_error"].as_str().unwrap();
    assert!(reason.contains("TLS-certificate-error"), "{reason}");
    assert_ne!(state["status"], "dead", "a TLS failure is retried");
    d.stop().await;
    assert!(seen.lock().unwrap().is_empty());

    // Named by egress.ca-file: delivered, over HTTP/2 (the receiver offers
    // h2 first by ALPN).
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let d = TestDaemon::start_with(plugins.path(), |c| c.egress.ca_file = Some(ca_file)).await;
    d.post_event(&event("trusted-1", "s", "t", json!({"n": 2})))
        .await;
    d.wait_delivery("trusted-1", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, axum::http::Version::HTTP_2);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&seen[0].1).unwrap(),
        json!({"n": 2})
    );
    d.stop().await;
}
