//! The history of failed attempts, on both stores (real PostgreSQL and
//! SQLite): a receiver on loopback answering 503 and then 200 through the
//! shipped webhook sink leaves one attempt per failure, with the
//! receiver's status and the reason, and none for the delivered attempt;
//! a rejection is recorded as dead with its status; the history of one
//! delivery keeps only its newest `limits::ATTEMPTS_KEPT` attempts, and
//! retention deletes what is older than `delivery.retention`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{event, Backend, PluginsDir, Receiver, TestDaemon, TestDb};
use outboxd::event::parse_one;
use outboxd::limits::ATTEMPTS_KEPT;
use outboxd::store::{AttemptFilter, AttemptOutcome, Finish, IngestItem, Store};
use serde_json::json;

async fn a_failing_receiver_leaves_its_attempts_with_the_status(backend: Backend) {
    let receiver = Receiver::start().await;
    let plugins = PluginsDir::new();
    plugins.add_webhook_to("hook", &receiver);
    let db = TestDb::new(backend).await;
    let url = db.url.clone();
    let d = TestDaemon::start_with(plugins.path(), move |c| {
        c.database_url = Some(url);
    })
    .await;

    // Two 503s, then the default 200.
    receiver.script(503, &[], "busy");
    receiver.script(503, &[], "busy");
    d.post_event(&event("e-1", "s1", "order.paid", json!({"n": 1})))
        .await;
    d.wait_delivery("e-1", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    assert_eq!(receiver.count(), 3, "two refusals and the delivery");

    let (status, listed) = d.get("/v1/admin/attempts?event_id=e-1").await;
    assert_eq!(status, 200, "{listed}");
    let attempts = listed["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        2,
        "one per failure, none for the delivery: {listed}"
    );
    let numbers: Vec<u64> = attempts
        .iter()
        .map(|a| a["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, [2, 1], "newest first: {listed}");
    for a in attempts {
        assert_eq!(a["status"], "503", "{a}");
        assert_eq!(a["reason"], "HTTP 503", "{a}");
        assert_eq!(a["outcome"], "retry", "{a}");
        assert_eq!(a["sink"], "hook", "{a}");
        assert_eq!(a["stream"], "s1", "{a}");
        assert!(a["duration_ms"].as_i64().is_some_and(|ms| ms >= 0), "{a}");
        assert!(
            a["attempted_at_ms"].as_i64().is_some_and(|ms| ms > 0),
            "{a}"
        );
    }

    // A refusal for good: dead, with the receiver's status.
    receiver.script(400, &[], "no such order");
    d.post_event(&event("e-2", "s2", "order.paid", json!({"n": 2})))
        .await;
    d.wait_delivery("e-2", Duration::from_secs(20), |x| x["status"] == "dead")
        .await;
    let (_, listed) = d.get("/v1/admin/attempts?event_id=e-2").await;
    let dead = &listed["attempts"][0];
    assert_eq!(dead["outcome"], "dead", "{listed}");
    assert_eq!(dead["status"], "400", "{listed}");
    assert_eq!(
        dead["reason"], "rejected: HTTP 400: no such order",
        "{listed}"
    );

    // An event delivered at once leaves nothing.
    d.post_event(&event("e-3", "s3", "order.paid", json!({"n": 3})))
        .await;
    d.wait_delivery("e-3", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    let (_, listed) = d.get("/v1/admin/attempts?event_id=e-3").await;
    assert_eq!(listed["attempts"], json!([]), "{listed}");

    // By delivery key, and by time.
    let (_, listed) = d.get("/v1/admin/attempts?sink=hook").await;
    let ids: Vec<&str> = listed["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["e-2", "e-1", "e-1"], "{listed}");
    let (_, listed) = d.get("/v1/admin/attempts?sink=another").await;
    assert_eq!(listed["attempts"], json!([]));
    let (_, listed) = d.get("/v1/admin/attempts?since=2999-01-01T00:00:00Z").await;
    assert_eq!(listed["attempts"], json!([]));

    // Bad input names the field.
    let (status, refused) = d.get("/v1/admin/attempts?limit=0").await;
    assert_eq!(
        (status, &refused["field"]),
        (400, &json!("limit")),
        "{refused}"
    );
    let (status, refused) = d.get("/v1/admin/attempts?until=tomorrow").await;
    assert_eq!(
        (status, &refused["field"]),
        (400, &json!("until")),
        "{refused}"
    );

    d.stop().await;
    db.cleanup().await;
}

fn item(id: &str, stream: &str, sink: &str) -> IngestItem {
    let ev = json!({"specversion": "1.0", "id": id, "source": "s", "type": "t", "partitionkey": stream, "data": {}});
    IngestItem {
        event: parse_one(ev.to_string().as_bytes()).unwrap(),
        sinks: vec![sink.to_string()],
        producer: None,
    }
}

/// Claim `sink`'s one due delivery and finish it with `finish`.
async fn attempt(store: &Arc<dyn Store>, sink: &str, finish: &Finish) {
    let claimed = store.claim(sink, 1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(claimed.len(), 1, "one delivery of {sink} due");
    let c = &claimed[0];
    assert!(store
        .finish(c.delivery_id, &c.lease_token, finish)
        .await
        .unwrap());
}

async fn of(store: &Arc<dyn Store>, event_id: &str) -> Vec<outboxd::store::Attempt> {
    let filter = AttemptFilter {
        event_id: Some(event_id.into()),
        ..Default::default()
    };
    store.list_attempts(&filter, 1000).await.unwrap()
}

async fn the_history_is_bounded_per_delivery_and_by_retention(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    store
        .ingest(&[item("long", "a", "x"), item("short", "b", "y")])
        .await
        .unwrap();
    let retry = Finish::Retry {
        delay: Duration::ZERO,
        reason: "HTTP 503".into(),
    };
    attempt(&store, "y", &retry).await;
    attempt(&store, "y", &retry).await;
    let extra = 5;
    for _ in 0..ATTEMPTS_KEPT + extra {
        attempt(&store, "x", &retry).await;
    }
    let long = of(&store, "long").await;
    assert_eq!(long.len(), ATTEMPTS_KEPT as usize, "the newest only");
    assert_eq!(long[0].attempt, ATTEMPTS_KEPT + extra, "newest first");
    assert_eq!(
        long.last().unwrap().attempt,
        extra + 1,
        "the oldest dropped"
    );
    assert!(long
        .iter()
        .all(|a| a.outcome == AttemptOutcome::Retry && a.status.as_deref() == Some("503")));
    assert_eq!(
        of(&store, "short").await.len(),
        2,
        "another delivery's history untouched"
    );

    // The delivered attempt writes nothing.
    attempt(&store, "x", &Finish::Delivered).await;
    let after = of(&store, "long").await;
    assert_eq!(after.len(), ATTEMPTS_KEPT as usize);
    assert_eq!(after[0].attempt, ATTEMPTS_KEPT + extra);

    // Retention: nothing is older than an hour; everything is older than
    // a moment ago.
    assert_eq!(
        store
            .purge_attempts(Duration::from_secs(3600), 1000)
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let purged = store
        .purge_attempts(Duration::from_millis(10), 30)
        .await
        .unwrap();
    assert_eq!(purged, 30, "one bounded batch");
    let purged = store
        .purge_attempts(Duration::from_millis(10), 1000)
        .await
        .unwrap();
    assert_eq!(purged, ATTEMPTS_KEPT as u64 + 2 - 30);
    assert!(of(&store, "long").await.is_empty());
    assert!(of(&store, "short").await.is_empty());
    db.cleanup().await;
}

/// The plugin's own words decide the status, before the host adds its own.
#[test]
fn the_status_is_read_from_the_start_of_a_reason() {
    use outboxd::store::attempt_status;
    let cases: [(&str, Option<&str>); 9] = [
        ("HTTP 503", Some("503")),
        ("HTTP 400: no such order", Some("400")),
        ("HTTP 429 too many", Some("429")),
        ("nacked: the broker refused it", Some("nacked")),
        ("unroutable: no queue bound", Some("unroutable")),
        ("HTTP transport error: connection refused", None),
        ("HTTP 5034", None),
        ("refused: exchange not allowed", None),
        ("plugin trap (deadline)", None),
    ];
    for (reason, status) in cases {
        assert_eq!(attempt_status(reason).as_deref(), status, "{reason}");
    }
}

use common::both_stores;

both_stores!(
    a_failing_receiver_leaves_its_attempts_with_the_status,
    the_history_is_bounded_per_delivery_and_by_retention,
);
