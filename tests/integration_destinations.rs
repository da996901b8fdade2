//! Destinations: many targets of one webhook sink, managed through the
//! admin API while the daemon runs — each with its own filters, order,
//! secret, retries, rate and state — on both stores, with real receivers
//! on loopback.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{
    event, eventually, new_secret, verify_signature, Backend, PluginsDir, Receiver, TestDaemon,
    TestDb,
};
use serde_json::{json, Value};

/// The webhook sink `webhook`, allowed to reach each receiver (loopback
/// addresses must be named exactly), its manifest's own target `fallback`.
fn plugins(fallback: &Receiver, receivers: &[&Receiver]) -> PluginsDir {
    let plugins = PluginsDir::new();
    let mut allow: Vec<String> = receivers.iter().map(|r| r.origin()).collect();
    allow.push(fallback.origin());
    plugins.add_webhook("webhook", &fallback.url(), &allow, &new_secret(), "");
    plugins
}

async fn start(
    plugins: &PluginsDir,
    db: &TestDb,
    adjust: impl FnOnce(&mut outboxd::config::Config),
) -> TestDaemon {
    let url = db.url.clone();
    TestDaemon::start_with(plugins.path(), move |c| {
        c.database_url = Some(url);
        adjust(c);
    })
    .await
}

async fn api(d: &TestDaemon, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let url = format!("{}{path}", d.base);
    let mut req = d
        .http
        .request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Create destination `name` of the webhook sink; returns its secret.
async fn create(d: &TestDaemon, name: &str, spec: Value) -> String {
    let mut body = spec;
    body["name"] = name.into();
    if body.get("sink").is_none() {
        body["sink"] = "webhook".into();
    }
    let (status, answer) = api(d, "POST", "/v1/admin/destinations", Some(body)).await;
    assert_eq!(status, 201, "create {name}: {answer}");
    answer["secret"].as_str().unwrap_or_default().to_string()
}

/// Ids of the events `r` received, in arrival order.
fn ids(r: &Receiver) -> Vec<String> {
    r.with_seen(|seen| {
        seen.iter()
            .map(|x| x.header("ce-id").expect("ce-id header"))
            .collect()
    })
}

/// The (stream → sequence list) each receiver got, from the CloudEvents
/// headers of its requests.
fn per_stream(r: &Receiver) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    r.with_seen(|seen| {
        for x in seen {
            let stream = x.header("ce-partitionkey").expect("ce-partitionkey header");
            let seq: u64 = x.header("ce-sequence").unwrap().parse().unwrap();
            out.entry(stream).or_default().push(seq);
        }
    });
    out
}

use common::both_stores;

both_stores!(
    fifty_destinations_each_get_exactly_their_events_in_order_signed_with_their_own_secret,
    a_failing_a_slow_a_throttling_and_a_rate_limited_destination_hold_back_no_other,
    backfill_update_park_and_purge_while_running,
    a_destination_failing_for_the_disable_period_is_disabled_and_resumes,
    bad_input_is_refused_naming_the_field_and_nothing_is_created,
    destinations_and_their_states_come_back_after_a_restart,
    a_platform_sync_creates_backfills_updates_and_pauses_and_never_echoes,
    a_rotated_secret_signs_beside_the_old_one_until_the_grace_period_ends,
    a_huge_backlog_on_one_destination_does_not_starve_another,
);

async fn fifty_destinations_each_get_exactly_their_events_in_order_signed_with_their_own_secret(
    backend: Backend,
) {
    const DESTINATIONS: usize = 50;
    const EVENTS: usize = 2_000;
    const STREAMS: usize = 40;
    let fallback = Receiver::start().await;
    let mut receivers = Vec::new();
    for _ in 0..DESTINATIONS {
        receivers.push(Receiver::start().await);
    }
    let plugins = plugins(&fallback, &receivers.iter().collect::<Vec<_>>());
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |_| {}).await;
    // Destination i takes type `t{i % 5}`; odd ones only the even streams,
    // every seventh also needs `tier == gold`.
    let mut secrets = Vec::new();
    for (i, r) in receivers.iter().enumerate() {
        let mut filter = json!({ "types": [format!("t{}", i % 5)] });
        if i % 2 == 1 {
            filter["streams"] = json!(["s*0", "s*2", "s*4", "s*6", "s*8"]);
        }
        if i % 7 == 0 {
            filter["where"] = json!(["tier == gold"]);
        }
        secrets.push(
            create(
                &d,
                &format!("dest-{i}"),
                json!({ "config": { "url": r.url() }, "filter": filter }),
            )
            .await,
        );
    }
    let matches = |i: usize, ty: usize, stream: usize, gold: bool| {
        ty == i % 5 && (i % 2 == 0 || stream % 2 == 0) && (i % 7 != 0 || gold)
    };
    let mut expected: Vec<Vec<String>> = vec![Vec::new(); DESTINATIONS];
    let mut batch = Vec::new();
    for n in 0..EVENTS {
        let (ty, stream, gold) = (n % 5, (n / 5) % STREAMS, n % 3 == 0);
        let id = format!("e{n}");
        let mut e = event(
            &id,
            &format!("s{stream}"),
            &format!("t{ty}"),
            json!({ "n": n }),
        );
        if gold {
            e["tier"] = "gold".into();
        }
        for (i, exp) in expected.iter_mut().enumerate() {
            if matches(i, ty, stream, gold) {
                exp.push(id.clone());
            }
        }
        batch.push(e);
        if batch.len() == 100 {
            d.post_batch(&batch).await;
            batch.clear();
        }
    }
    let total: usize = expected.iter().map(Vec::len).sum();
    let done = eventually(Duration::from_secs(240), || {
        receivers.iter().map(Receiver::count).sum::<usize>() >= total
    })
    .await;
    assert!(
        done,
        "{} of {total} deliveries arrived",
        receivers.iter().map(Receiver::count).sum::<usize>()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (i, r) in receivers.iter().enumerate() {
        let mut got = ids(r);
        got.sort();
        got.dedup();
        let mut want = expected[i].clone();
        want.sort();
        assert_eq!(
            got, want,
            "dest-{i} got other events than its filter matches"
        );
        for (stream, seqs) in per_stream(r) {
            assert!(
                seqs.windows(2).all(|w| w[0] <= w[1]),
                "dest-{i} stream {stream}: out of order {seqs:?}"
            );
        }
        r.with_seen(|seen| {
            for x in seen {
                assert!(
                    verify_signature(&secrets[i], x),
                    "dest-{i}: request not signed with its own secret"
                );
                let other = &secrets[(i + 1) % DESTINATIONS];
                assert!(
                    !verify_signature(other, x),
                    "dest-{i}: request verifies with another destination's secret"
                );
            }
        });
    }
    assert_eq!(
        fallback.count(),
        0,
        "the manifest's own target got events although the sink has destinations"
    );
    d.stop().await;
    db.cleanup().await;
}

async fn a_failing_a_slow_a_throttling_and_a_rate_limited_destination_hold_back_no_other(
    backend: Backend,
) {
    let (failing, limited, healthy, fallback) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let (slow, throttling) = (Receiver::start().await, Receiver::start().await);
    for _ in 0..10_000 {
        failing.script(503, &[], "down");
        throttling.script(429, &[("retry-after", "60")], "slow down");
    }
    // Each answer takes 3 s: 40 events on 4 streams take at least 30 s.
    slow.set_delay(Duration::from_secs(3));
    let plugins = plugins(
        &fallback,
        &[&failing, &limited, &healthy, &slow, &throttling],
    );
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |_| {}).await;
    create(&d, "failing", json!({ "config": { "url": failing.url() } })).await;
    create(
        &d,
        "limited",
        json!({ "config": { "url": limited.url() }, "rate_per_second": 5 }),
    )
    .await;
    create(&d, "healthy", json!({ "config": { "url": healthy.url() } })).await;
    create(&d, "slow", json!({ "config": { "url": slow.url() } })).await;
    create(
        &d,
        "throttling",
        json!({ "config": { "url": throttling.url() } }),
    )
    .await;
    const N: usize = 40;
    let started = Instant::now();
    let batch: Vec<Value> = (0..N)
        .map(|n| {
            event(
                &format!("r{n}"),
                &format!("s{}", n % 4),
                "t",
                json!({ "n": n }),
            )
        })
        .collect();
    d.post_batch(&batch).await;
    assert!(
        eventually(Duration::from_secs(30), || healthy.count() >= N).await,
        "healthy destination got {} of {N}",
        healthy.count()
    );
    let healthy_done = started.elapsed();
    // At 5/s, 40 events take at least (40 - 5 burst) / 5 = 7 s.
    assert!(
        limited.count() < N,
        "the rate-limited destination already had all {N} when the healthy one finished ({healthy_done:?})"
    );
    assert!(
        failing.count() > 0,
        "the failing destination was never tried"
    );
    // The slow receiver has had at most one round per 3 s per stream, and
    // the throttling one its first request per stream, then a 60 s wait.
    assert!(
        slow.count() < N,
        "the slow destination had all {N} when the healthy one finished ({healthy_done:?})"
    );
    assert!(
        eventually(Duration::from_secs(10), || throttling.count() > 0).await,
        "the throttling destination was never tried"
    );
    assert!(
        throttling.count() <= 4,
        "the throttling destination had {} requests, more than one per stream",
        throttling.count()
    );
    assert!(
        eventually(Duration::from_secs(60), || limited.count() >= N).await,
        "limited destination got {} of {N}",
        limited.count()
    );
    // The bucket: at most its burst (5) plus 5 per second in any window of 1 s.
    let times: Vec<Instant> = limited.with_seen(|s| s.iter().map(|x| x.at).collect());
    let worst = times
        .iter()
        .map(|t0| {
            times
                .iter()
                .filter(|t| **t >= *t0 && **t < *t0 + Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    assert!(
        worst <= 10,
        "{worst} requests within one second at a destination limited to 5/s"
    );
    let span = *times.last().unwrap() - times[0];
    assert!(
        span >= Duration::from_secs(6),
        "{N} requests at 5/s arrived within {span:?}"
    );
    // The failing destination's events are retrying, not dead, and not
    // counted against anyone else.
    let (_, show) = api(&d, "GET", "/v1/admin/destinations/failing", None).await;
    assert_eq!(show["queue"]["dead"], 0, "{show}");
    assert!(show["health"]["last_status"] == "failed", "{show}");
    assert!(
        show["health"]["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("503"),
        "{show}"
    );
    let (_, show) = api(&d, "GET", "/v1/admin/destinations/healthy", None).await;
    assert_eq!(show["health"]["last_status"], "delivered", "{show}");
    d.stop().await;
    db.cleanup().await;
}

async fn backfill_update_park_and_purge_while_running(backend: Backend) {
    let (first, second, fallback) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let plugins = plugins(&fallback, &[&first, &second]);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |_| {}).await;
    // Stored before the destination exists: the sink's own key takes them.
    let early: Vec<Value> = (0..6)
        .map(|n| {
            event(
                &format!("early{n}"),
                &format!("s{}", n % 2),
                "t",
                json!({ "n": n }),
            )
        })
        .collect();
    d.post_batch(&early).await;
    assert!(eventually(Duration::from_secs(10), || fallback.count() == 6).await);
    create(
        &d,
        "main",
        json!({ "config": { "url": first.url() }, "backfill_since": "2000-01-01T00:00:00Z" }),
    )
    .await;
    assert!(
        eventually(Duration::from_secs(10), || first.count() == 6).await,
        "backfill delivered {}",
        first.count()
    );
    for (stream, seqs) in per_stream(&first) {
        assert_eq!(
            seqs,
            vec![1, 2, 3],
            "backfilled stream {stream} out of order"
        );
    }
    // Update the URL while running: later events go to the new one.
    let (status, put) = api(
        &d,
        "PUT",
        "/v1/admin/destinations/main",
        Some(json!({ "sink": "webhook", "config": { "url": second.url() } })),
    )
    .await;
    assert_eq!(status, 200, "{put}");
    assert_eq!(put["changed"], true);
    // The same PUT again is a no-op.
    let (_, again) = api(
        &d,
        "PUT",
        "/v1/admin/destinations/main",
        Some(json!({ "sink": "webhook", "config": { "url": second.url() } })),
    )
    .await;
    assert_eq!(again["changed"], false, "{again}");
    d.post_event(&event("late1", "s0", "t", json!({}))).await;
    assert!(eventually(Duration::from_secs(10), || second.count() == 1).await);
    assert_eq!(first.count(), 6);
    // Delete with park: later events are not routed to it; the ones it
    // had pending wait under its name, and a new destination of that
    // name delivers them.
    let (status, _) = api(&d, "POST", "/v1/admin/destinations/main/pause", None).await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    d.post_event(&event("parked1", "s0", "t", json!({}))).await;
    let (status, refused) = api(&d, "DELETE", "/v1/admin/destinations/main", None).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["field"], "pending");
    let (status, deleted) = api(
        &d,
        "DELETE",
        "/v1/admin/destinations/main?pending=park",
        None,
    )
    .await;
    assert_eq!(status, 200, "{deleted}");
    let parked = d
        .delivery("parked1", "main")
        .await
        .expect("parked delivery kept");
    assert_eq!(parked["status"], "pending", "{parked}");
    create(&d, "main", json!({ "config": { "url": second.url() } })).await;
    assert!(
        eventually(Duration::from_secs(10), || second.count() == 2).await,
        "parked delivery not delivered after re-create"
    );
    // Delete with purge: its pending deliveries are gone, counted.
    api(&d, "POST", "/v1/admin/destinations/main/pause", None).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    d.post_batch(&[
        event("purged1", "s0", "t", json!({})),
        event("purged2", "s1", "t", json!({})),
    ])
    .await;
    let (status, deleted) = api(
        &d,
        "DELETE",
        "/v1/admin/destinations/main?pending=purge",
        None,
    )
    .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["purged"]["pending"], 2, "{deleted}");
    assert!(d.delivery("purged1", "main").await.is_none());
    d.stop().await;
    db.cleanup().await;
}

async fn a_destination_failing_for_the_disable_period_is_disabled_and_resumes(backend: Backend) {
    let (target, fallback) = (Receiver::start().await, Receiver::start().await);
    for _ in 0..10_000 {
        target.script(500, &[], "broken");
    }
    let plugins = plugins(&fallback, &[&target]);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |c| {
        c.destinations.disable_after = Duration::from_secs(2)
    })
    .await;
    create(&d, "flaky", json!({ "config": { "url": target.url() } })).await;
    d.post_batch(&[
        event("f1", "s", "t", json!({})),
        event("f2", "s", "t", json!({})),
    ])
    .await;
    let mut state = Value::Null;
    let disabled = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, show) = api(&d, "GET", "/v1/admin/destinations/flaky", None).await;
            if show["state"] == "disabled" {
                state = show;
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    assert!(disabled, "never disabled: {state}");
    assert!(
        state["state_reason"]
            .as_str()
            .unwrap()
            .contains("every attempt failed"),
        "{state}"
    );
    assert_eq!(state["queue"]["dead"], 0, "disable dead-lettered: {state}");
    // A batch already under way when it was disabled may still finish.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let tried = target.count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        target.count(),
        tried,
        "a disabled destination is still tried"
    );
    target.clear_script();
    let (status, resumed) = api(&d, "POST", "/v1/admin/destinations/flaky/resume", None).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["state"], "active");
    d.wait_sink("f2", "flaky", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    d.stop().await;
    db.cleanup().await;
}

async fn bad_input_is_refused_naming_the_field_and_nothing_is_created(backend: Backend) {
    let (target, fallback) = (Receiver::start().await, Receiver::start().await);
    let plugins = plugins(&fallback, &[&target]);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |_| {}).await;
    let url = target.url();
    let cases = [
        (
            json!({ "name": "a", "sink": "nosuch", "config": { "url": url } }),
            400,
            "sink",
        ),
        (
            json!({ "name": "a", "sink": "webhook", "config": { "url": "http://127.0.0.1:1/x" } }),
            400,
            "config.url",
        ),
        (
            json!({ "name": "a", "sink": "webhook", "config": { "url": "http://169.254.169.254/latest" } }),
            400,
            "config.url",
        ),
        (
            json!({ "name": "a", "sink": "webhook", "config": { "url": "http://10.1.2.3/" } }),
            400,
            "config.url",
        ),
        (
            json!({ "name": "a", "sink": "webhook", "config": { "url": url }, "filter": { "where": ["tier ~ gold"] } }),
            400,
            "filter.where[0]",
        ),
        (
            json!({ "name": "a", "sink": "webhook", "config": { "url": url }, "rate_per_second": 0 }),
            400,
            "rate_per_second",
        ),
        (
            json!({ "name": "a", "sink": "webhook", "config": { "url": url }, "retry": { "window": "400d" } }),
            400,
            "retry.window",
        ),
        (
            json!({ "name": "a", "sink": "webhook", "config": { "url": url, "timeout-ms": "soon" } }),
            400,
            "config",
        ),
        (
            json!({ "name": "a", "sink": "webhook", "config": { "url": url }, "colour": "red" }),
            400,
            "colour",
        ),
        (
            json!({ "name": "webhook", "sink": "webhook", "config": { "url": url } }),
            400,
            "name",
        ),
        (
            json!({ "name": "a b", "sink": "webhook", "config": { "url": url } }),
            400,
            "name",
        ),
        (
            json!({ "sink": "webhook", "config": { "url": url } }),
            400,
            "name",
        ),
    ];
    for (body, status, field) in cases {
        let (got, answer) = api(&d, "POST", "/v1/admin/destinations", Some(body.clone())).await;
        assert_eq!(got, status, "{body} → {answer}");
        assert_eq!(answer["field"], field, "{body} → {answer}");
    }
    let (_, list) = api(&d, "GET", "/v1/admin/destinations", None).await;
    assert_eq!(
        list["destinations"],
        json!([]),
        "a refused request created something: {list}"
    );
    create(&d, "a", json!({ "config": { "url": url } })).await;
    let (status, dup) = api(
        &d,
        "POST",
        "/v1/admin/destinations",
        Some(json!({ "name": "a", "sink": "webhook", "config": { "url": url } })),
    )
    .await;
    assert_eq!(status, 409, "{dup}");
    // The secret is never shown again.
    let (_, shown) = api(&d, "GET", "/v1/admin/destinations/a", None).await;
    assert_eq!(shown["has_secret"], true, "{shown}");
    assert!(
        !shown.to_string().contains("whsec_"),
        "show printed a secret: {shown}"
    );
    let (status, _) = api(&d, "GET", "/v1/admin/destinations/nosuch", None).await;
    assert_eq!(status, 404);
    d.stop().await;
    db.cleanup().await;
}

async fn destinations_and_their_states_come_back_after_a_restart(backend: Backend) {
    let (a, b, fallback) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let plugins = plugins(&fallback, &[&a, &b]);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |_| {}).await;
    let secret = create(&d, "a", json!({ "config": { "url": a.url() } })).await;
    create(
        &d,
        "b",
        json!({ "config": { "url": b.url() }, "state": "paused" }),
    )
    .await;
    d.post_batch(&[
        event("x1", "s", "t", json!({})),
        event("x2", "s", "t", json!({})),
    ])
    .await;
    assert!(eventually(Duration::from_secs(10), || a.count() == 2).await);
    d.stop().await;
    let d = start(&plugins, &db, |_| {}).await;
    d.post_event(&event("x3", "s", "t", json!({}))).await;
    assert!(eventually(Duration::from_secs(10), || a.count() == 3).await);
    assert!(a.with_seen(|s| s.iter().all(|x| verify_signature(&secret, x))));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        b.count(),
        0,
        "a paused destination delivered after the restart"
    );
    let (_, show) = api(&d, "GET", "/v1/admin/destinations/b", None).await;
    assert_eq!(show["state"], "paused", "{show}");
    assert_eq!(show["queue"]["pending"], 3, "{show}");
    api(&d, "POST", "/v1/admin/destinations/b/resume", None).await;
    assert!(eventually(Duration::from_secs(10), || b.count() == 3).await);
    assert_eq!(ids(&b), vec!["x1", "x2", "x3"]);
    d.stop().await;
    db.cleanup().await;
}

/// Run the `outboxd` binary with `args` against the daemon `d`.
fn cli(d: &TestDaemon, args: &[&str]) -> (bool, String, String) {
    let listen = d.base.trim_start_matches("http://").to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(["--listen", &listen])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_manages_destinations_through_the_daemon() {
    let (target, fallback) = (Receiver::start().await, Receiver::start().await);
    let plugins = plugins(&fallback, &[&target]);
    let db = TestDb::new(Backend::Sqlite).await;
    let d = start(&plugins, &db, |_| {}).await;
    let url = format!("url={}", target.url());
    let (ok, out, err) = cli(
        &d,
        &[
            "destinations",
            "create",
            "cli-1",
            "--sink",
            "webhook",
            "--set",
            &url,
            "--where",
            "tier != bronze",
        ],
    );
    assert!(ok, "{err}");
    let created: Value = serde_json::from_str(&out).unwrap();
    let secret = created["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"), "{out}");
    d.post_batch(&[event("c1", "s", "t", json!({})), {
        let mut e = event("c2", "s", "t", json!({}));
        e["tier"] = "bronze".into();
        e
    }])
    .await;
    assert!(eventually(Duration::from_secs(10), || target.count() == 1).await);
    assert!(target.with_seen(|s| verify_signature(&secret, &s[0])));
    let (ok, out, _) = cli(&d, &["destinations", "list"]);
    assert!(
        ok && out.contains("\"cli-1\"") && !out.contains(&secret),
        "{out}"
    );
    // A refusal names the field and fails the command.
    let (ok, _, err) = cli(
        &d,
        &[
            "destinations",
            "create",
            "cli-2",
            "--sink",
            "webhook",
            "--set",
            &url,
            "--rate",
            "0",
        ],
    );
    assert!(!ok && err.contains("rate_per_second"), "{err}");
    let (ok, _, err) = cli(&d, &["destinations", "delete", "cli-1"]);
    assert!(!ok && err.contains("--pending"), "{err}");
    let (ok, out, err) = cli(
        &d,
        &["destinations", "delete", "cli-1", "--pending", "park"],
    );
    assert!(ok, "{err}");
    assert!(out.contains("\"deleted\": \"cli-1\""), "{out}");
    d.stop().await;
    db.cleanup().await;
}

async fn a_platform_sync_creates_backfills_updates_and_pauses_and_never_echoes(backend: Backend) {
    let (a, a2, b, fallback) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let plugins = plugins(&fallback, &[&a, &a2, &b]);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |_| {}).await;
    let from = |id: &str, platform: Option<&str>| {
        let mut e = event(id, "packet-1", "t", json!({ "id": id }));
        if let Some(p) = platform {
            e["requestingplatform"] = p.into();
        }
        e
    };
    d.post_batch(&[
        from("e1", Some("alpha")),
        from("e2", Some("beta")),
        from("e3", None),
    ])
    .await;
    let (sa, sb) = (new_secret(), new_secret());
    let platforms = |a_url: &str, with_beta: bool| {
        let mut list = vec![json!({ "name": "alpha", "url": a_url, "secret": sa })];
        if with_beta {
            list.push(json!({ "name": "beta", "url": b.url(), "secret": sb }));
        }
        json!({ "platforms": list, "prefix": "p-" })
    };
    let sync =
        |body: Value| async { api(&d, "POST", "/v1/admin/destinations/sync", Some(body)).await };
    let (status, report) = sync(platforms(&a.url(), true)).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["created"], json!(["p-alpha", "p-beta"]), "{report}");
    // Backfilled, never echoed: alpha never gets what alpha sent.
    assert!(eventually(Duration::from_secs(10), || a.count() == 2 && b.count() == 2).await);
    assert_eq!(ids(&a), vec!["e2", "e3"]);
    assert_eq!(ids(&b), vec!["e1", "e3"]);
    assert!(a.with_seen(|s| s.iter().all(|x| verify_signature(&sa, x))));
    assert!(b.with_seen(|s| s.iter().all(|x| verify_signature(&sb, x))));
    // The same list again changes nothing.
    let (_, report) = sync(platforms(&a.url(), true)).await;
    assert_eq!(
        report["unchanged"],
        json!(["p-alpha", "p-beta"]),
        "{report}"
    );
    // A changed URL is updated in place.
    let (_, report) = sync(platforms(&a2.url(), true)).await;
    assert_eq!(report["updated"], json!(["p-alpha"]), "{report}");
    d.post_event(&from("e4", Some("gamma"))).await;
    assert!(
        eventually(Duration::from_secs(10), || a2.count() == 1
            && b.count() == 3)
        .await
    );
    // A platform gone from the list is paused; its deliveries wait.
    let (_, report) = sync(platforms(&a2.url(), false)).await;
    assert_eq!(report["paused"], json!(["p-beta"]), "{report}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    d.post_event(&from("e5", Some("alpha"))).await;
    d.post_event(&from("e6", None)).await;
    assert!(eventually(Duration::from_secs(10), || a2.count() == 2).await);
    let (_, shown) = api(&d, "GET", "/v1/admin/destinations/p-beta", None).await;
    assert_eq!(shown["state"], "paused", "{shown}");
    assert_eq!(shown["queue"]["pending"], 2, "{shown}");
    assert_eq!(b.count(), 3);
    // Back in the list: active again, and what waited is delivered in order.
    let (_, report) = sync(platforms(&a2.url(), true)).await;
    assert_eq!(report["updated"], json!(["p-beta"]), "{report}");
    assert!(eventually(Duration::from_secs(10), || b.count() == 5).await);
    assert_eq!(ids(&b), vec!["e1", "e3", "e4", "e5", "e6"]);
    assert_eq!(ids(&a2), vec!["e4", "e6"]);
    // A bad entry refuses the whole sync, naming it.
    let (status, refused) = sync(json!({ "platforms": [{ "name": "alpha", "url": a2.url() }, { "name": "alpha", "url": b.url() }] })).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["field"], "platforms[1].name");
    d.stop().await;
    db.cleanup().await;
}

async fn a_rotated_secret_signs_beside_the_old_one_until_the_grace_period_ends(backend: Backend) {
    let (target, fallback) = (Receiver::start().await, Receiver::start().await);
    let plugins = plugins(&fallback, &[&target]);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |_| {}).await;
    let old = create(&d, "rot", json!({ "config": { "url": target.url() } })).await;
    d.post_event(&event("r1", "s", "t", json!({}))).await;
    assert!(eventually(Duration::from_secs(10), || target.count() == 1).await);
    let (status, rotated) = api(
        &d,
        "POST",
        "/v1/admin/destinations/rot/rotate-secret",
        Some(json!({ "grace": "3s" })),
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    let new = rotated["secret"].as_str().unwrap().to_string();
    assert!(new.starts_with("whsec_") && new != old);
    let (_, shown) = api(&d, "GET", "/v1/admin/destinations/rot", None).await;
    assert!(
        !shown.to_string().contains(&new) && !shown.to_string().contains(&old),
        "{shown}"
    );
    // Within the grace period: both signatures, each verifying.
    d.post_event(&event("r2", "s", "t", json!({}))).await;
    assert!(eventually(Duration::from_secs(10), || target.count() == 2).await);
    let during = target.seen()[1].clone();
    assert!(
        verify_signature(&old, &during) && verify_signature(&new, &during),
        "{:?}",
        during.header("webhook-signature")
    );
    // After it: the new one only.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    d.post_event(&event("r3", "s", "t", json!({}))).await;
    assert!(eventually(Duration::from_secs(10), || target.count() == 3).await);
    let after = target.seen()[2].clone();
    assert!(
        verify_signature(&new, &after),
        "not signed with the new secret"
    );
    assert!(
        !verify_signature(&old, &after),
        "still signed with the old secret after the grace period"
    );
    d.stop().await;
    db.cleanup().await;
}

async fn a_huge_backlog_on_one_destination_does_not_starve_another(backend: Backend) {
    let (big, small, fallback) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    // Each request to `big` takes 5 ms: its backlog drains for seconds.
    big.set_delay(Duration::from_millis(5));
    let plugins = plugins(&fallback, &[&big, &small]);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |_| {}).await;
    create(
        &d,
        "big",
        json!({ "config": { "url": big.url() }, "filter": { "types": ["bulk"] } }),
    )
    .await;
    create(
        &d,
        "small",
        json!({ "config": { "url": small.url() }, "filter": { "types": ["urgent"] } }),
    )
    .await;
    const BACKLOG: usize = 3_000;
    for chunk in 0..BACKLOG / 500 {
        let batch: Vec<Value> = (chunk * 500..(chunk + 1) * 500)
            .map(|n| {
                event(
                    &format!("bulk{n}"),
                    &format!("s{}", n % 30),
                    "bulk",
                    json!({ "n": n }),
                )
            })
            .collect();
        d.post_batch(&batch).await;
    }
    let batch: Vec<Value> = (0..10)
        .map(|n| {
            event(
                &format!("urgent{n}"),
                &format!("u{n}"),
                "urgent",
                json!({ "n": n }),
            )
        })
        .collect();
    d.post_batch(&batch).await;
    let started = Instant::now();
    assert!(
        eventually(Duration::from_secs(15), || small.count() == 10).await,
        "the small destination got {} of 10 behind a backlog of {BACKLOG}",
        small.count()
    );
    let waited = started.elapsed();
    assert!(
        big.count() < BACKLOG,
        "the backlog was already drained ({waited:?}): the test shows nothing"
    );
    eprintln!(
        "small destination served in {waited:?} with {} of {BACKLOG} of the big one's delivered",
        big.count()
    );
    d.stop().await;
    db.cleanup().await;
}
