//! Replicas that disagree about their plugins: the set of sinks is kept in
//! the database, so every event gets a delivery for every registered sink
//! whichever replica took it in; each replica delivers only for the sinks
//! it has; a sink no replica serves waits and is reported; retiring is an
//! explicit act. Real PostgreSQL, two daemons, receivers on loopback.

mod common;

use std::time::Duration;

use common::{event, eventually, new_secret, Backend, PluginsDir, Receiver, TestDaemon, TestDb};
use serde_json::{json, Value};

async fn replica(plugins: &PluginsDir, db: &TestDb) -> TestDaemon {
    let url = db.url.clone();
    TestDaemon::start_with(plugins.path(), move |c| {
        c.database_url = Some(url);
        c.delivery.replica_timeout = Duration::from_secs(4);
    })
    .await
}

async fn sinks(d: &TestDaemon) -> Vec<Value> {
    let (status, body) = d.get("/v1/admin/sinks").await;
    assert_eq!(status, 200, "{body}");
    body["sinks"].as_array().unwrap().clone()
}

async fn sink(d: &TestDaemon, name: &str) -> Value {
    sinks(d)
        .await
        .into_iter()
        .find(|s| s["sink"] == name)
        .unwrap_or(Value::Null)
}

/// Wait until `check` holds for sink `name` as `d` reports it.
async fn wait_sink_state(
    d: &TestDaemon,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = sink(d, name).await;
        if check(&s) {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name}: never {what}: {s}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_with_different_plugins_route_every_event_to_every_registered_sink() {
    let (hooks, mirror, third) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let (pa, pb) = (PluginsDir::new(), PluginsDir::new());
    pa.add_webhook(
        "hooks",
        &hooks.url(),
        &[hooks.origin(), third.origin()],
        &new_secret(),
        "",
    );
    pb.add_webhook_to("mirror", &mirror);
    let db = TestDb::new(Backend::Postgres).await;
    let a = replica(&pa, &db).await;
    let b = replica(&pb, &db).await;
    // A registered `hooks` before B started; B's own start registered
    // `mirror`: A learns it within a heartbeat.
    wait_sink_state(&a, "mirror", "registered", |s| s["registered"] == true).await;
    for i in 1..=3 {
        a.post_event(&event(&format!("a{i}"), "s", "t", json!({})))
            .await;
        b.post_event(&event(&format!("b{i}"), "s", "t", json!({})))
            .await;
    }
    assert!(
        eventually(Duration::from_secs(20), || hooks.count() == 6
            && mirror.count() == 6)
        .await,
        "hooks got {}, mirror got {} of 6",
        hooks.count(),
        mirror.count()
    );
    for id in ["a1", "a2", "a3", "b1", "b2", "b3"] {
        let sinks: Vec<String> = a
            .deliveries(id)
            .await
            .iter()
            .map(|d| d["sink"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(sinks, vec!["hooks", "mirror"], "{id}");
    }
    let s = sink(&a, "mirror").await;
    assert_eq!(s["state"], "elsewhere", "{s}");
    assert_eq!(s["replicas"].as_array().unwrap().len(), 1, "{s}");

    // A sink added to one replica while both run: the other's next ingest
    // routes to it.
    pa.add_webhook_to("third", &third);
    wait_sink_state(&b, "third", "registered", |s| s["registered"] == true).await;
    b.post_event(&event("b4", "s", "t", json!({}))).await;
    assert!(
        eventually(Duration::from_secs(20), || third.count() == 1).await,
        "third got {}",
        third.count()
    );

    // Version skew: B loads `hooks` too, from another manifest.
    pb.add_webhook_to("hooks", &hooks);
    let s = wait_sink_state(&a, "hooks", "skewed", |s| s["version_skew"] == true).await;
    assert_eq!(s["replicas"].as_array().unwrap().len(), 2, "{s}");
    // One .wasm (one component_sha), two manifests (two manifest_sha).
    let (r0, r1) = (&s["replicas"][0], &s["replicas"][1]);
    assert_eq!(r0["component_sha"], r1["component_sha"], "{s}");
    assert_ne!(r0["manifest_sha"], r1["manifest_sha"], "{s}");
    std::fs::remove_file(pb.path().join("hooks.toml")).unwrap();

    // A sink no replica serves: its deliveries wait, reported; delivered
    // once a replica with the plugin starts.
    b.stop().await;
    let s = wait_sink_state(&a, "mirror", "unserved", |s| s["unserved"] == true).await;
    assert_eq!(s["replicas"], json!([]), "{s}");
    let (_, ready) = a.get("/ready").await;
    assert_eq!(
        ready["checks"]["fleet"]["unserved"],
        json!(["mirror"]),
        "{ready}"
    );
    let metrics = a.metrics_text().await;
    assert!(
        metrics.contains("outboxd_sink_serving_replicas{sink=\"mirror\"} 0"),
        "{metrics}"
    );
    a.post_event(&event("a5", "s", "t", json!({}))).await;
    let waiting = a
        .delivery("a5", "mirror")
        .await
        .expect("a delivery for the unserved sink");
    assert_eq!(waiting["status"], "pending", "{waiting}");
    let b = replica(&pb, &db).await;
    assert!(
        eventually(Duration::from_secs(20), || mirror.count() == 8).await,
        "mirror got {}",
        mirror.count()
    );

    // Retire: no new deliveries for it, from any replica.
    let (status, body) = a
        .http
        .post(format!("{}/v1/admin/sinks/mirror/retire", a.base))
        .send()
        .await
        .map(|r| (r.status().as_u16(), r))
        .unwrap();
    assert_eq!(status, 200, "{:?}", body.text().await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    b.post_event(&event("b6", "s", "t", json!({}))).await;
    a.post_event(&event("a6", "s", "t", json!({}))).await;
    for id in ["a6", "b6"] {
        assert!(
            a.delivery(id, "mirror").await.is_none(),
            "{id} routed to a retired sink"
        );
        assert!(
            a.delivery(id, "hooks").await.is_some(),
            "{id} not routed to hooks"
        );
    }
    a.stop().await;
    b.stop().await;
    db.cleanup().await;
}
