//! The HTTP ingest API on both stores: bad input is a clear 4xx with
//! nothing stored, duplicates and conflicts, routes, the read API, and
//! refusing to start on a database with pending migrations.

mod common;

use std::time::Duration;

use common::*;
use outboxd::routing::Route;
use serde_json::json;

async fn daemon(backend: Backend, plugins: &std::path::Path) -> (TestDb, TestDaemon) {
    let db = TestDb::new(backend).await;
    let url = db.url.clone();
    let d = TestDaemon::start_with(plugins, |c| {
        c.database_url = Some(url);
        c.ingest.max_body_bytes = 64 * 1024;
        c.ingest.max_batch_items = 10;
    })
    .await;
    (db, d)
}

async fn stored(d: &TestDaemon, id: &str) -> bool {
    d.get(&format!("/v1/events/{}", urlencode(id))).await.0 == 200
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

async fn bad_input_is_refused_naming_the_field(backend: Backend) {
    let plugins = PluginsDir::new();
    let (db, d) = daemon(backend, plugins.path()).await;
    let ce = "application/cloudevents+json";

    // Body over the limit → 413 naming the limit.
    let big = event("big", "s", "t", json!({"blob": "x".repeat(70 * 1024)}));
    let (status, body) = d.post(ce, serde_json::to_vec(&big).unwrap()).await;
    assert_eq!(status, 413, "{body}");
    assert!(body["error"].as_str().unwrap().contains("65536"), "{body}");
    assert!(!stored(&d, "big").await);

    // Invalid UTF-8 inside a text attribute → 400.
    let mut bytes =
        br#"{"specversion":"1.0","id":"utf","source":"s","type":"t","subject":"a"#.to_vec();
    bytes.extend_from_slice(&[0xff, 0xfe]);
    bytes.extend_from_slice(br#""}"#);
    let (status, body) = d.post(ce, bytes).await;
    assert_eq!(status, 400, "{body}");
    assert!(!stored(&d, "utf").await);

    // NUL in a text attribute → 400 naming it; in JSON data → kept losslessly.
    let (status, body) = d
        .post(
            ce,
            r#"{"specversion":"1.0","id":"nul","source":"s","type":"t","subject":"a\u0000b"}"#,
        )
        .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("subject")),
        "{body}"
    );
    let (status, body) = d
        .post(ce, r#"{"specversion":"1.0","id":"nul-data","source":"s","type":"t","data":{"x":"a\u0000b"}}"#)
        .await;
    assert_eq!(status, 201, "{body}");
    let (_, got) = d.get("/v1/events/nul-data").await;
    assert_eq!(got["event"]["data"]["x"], "a\u{0}b");

    // Over-long id and stream key → 400.
    let long = "i".repeat(300);
    let (status, body) = d
        .post(
            ce,
            serde_json::to_vec(&event(&long, "s", "t", json!({}))).unwrap(),
        )
        .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("id")),
        "{body}"
    );
    let (status, body) = d
        .post(
            ce,
            serde_json::to_vec(&event("ls", &"p".repeat(300), "t", json!({}))).unwrap(),
        )
        .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("partitionkey")),
        "{body}"
    );

    // A batch over the item limit → 413 naming it; nothing stored.
    let batch: Vec<_> = (0..11)
        .map(|i| event(&format!("b{i}"), "s", "t", json!({})))
        .collect();
    let (status, body) = d
        .post(
            "application/cloudevents-batch+json",
            serde_json::to_vec(&batch).unwrap(),
        )
        .await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("max-batch-items"),
        "{body}"
    );
    assert!(!stored(&d, "b0").await);

    // Duplicate → 200 with duplicate: true and the original sequence;
    // conflict → 409 naming the attributes.
    let e = event("dup", "s", "t", json!({"a": 1, "b": 2}));
    let (status, first) = d.post(ce, serde_json::to_vec(&e).unwrap()).await;
    assert_eq!(status, 201);
    let (status, again) = d.post(ce, r#"{"data":{"b":2,"a":1},"specversion":"1.0","id":"dup","source":"https://example.com/tests","type":"t","partitionkey":"s","datacontenttype":"application/json"}"#).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["sequence"], first["sequence"]);
    let (status, conflict) = d
        .post(
            ce,
            serde_json::to_vec(&event("dup", "s", "t", json!({"a": 9}))).unwrap(),
        )
        .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["attributes"], json!(["data"]));
    d.stop().await;
    db.cleanup().await;
}

/// The CloudEvents 1.0 attribute rules a new user runs into, over HTTP:
/// each refused event is a 400 naming the attribute and stores nothing;
/// an empty batch is a valid batch (200, nothing stored).
async fn cloudevents_attribute_rules_are_kept(backend: Backend) {
    let plugins = PluginsDir::new();
    let (db, d) = daemon(backend, plugins.path()).await;
    let ce = "application/cloudevents+json";
    let refused: &[(&str, &str, &str)] = &[
        // datacontenttype: RFC 2046 media type, non-empty when present.
        ("ct-xyz", r#""datacontenttype":"xyz""#, "datacontenttype"),
        ("ct-empty", r#""datacontenttype":"""#, "datacontenttype"),
        // dataschema: URI, non-empty when present.
        ("ds-empty", r#""dataschema":"""#, "dataschema"),
        // subject: non-empty when present, whatever the stream key is.
        ("subj-empty", r#""subject":"""#, "subject"),
        (
            "subj-empty-pk",
            r#""partitionkey":"p","subject":"""#,
            "subject",
        ),
        // Extension numbers are CloudEvents Integers: whole, 32-bit signed.
        ("ext-float", r#""count":1.5"#, "extensions.count"),
        ("ext-big", r#""count":2147483648"#, "extensions.count"),
        ("ext-small", r#""count":-2147483649"#, "extensions.count"),
        // time: RFC 3339.
        ("t-nosec", r#""time":"2024-05-01T18:31Z""#, "time"),
        ("t-offset", r#""time":"2024-05-01T18:31:00+25:00""#, "time"),
        ("t-hour", r#""time":"2024-05-01T18:31:00+05""#, "time"),
        // Extension names: lower-case letters and digits.
        ("ext-caps", r#""myExt":"x""#, "extensions.myExt"),
        ("ext-punct", r#""my-ext":"x""#, "extensions.my-ext"),
    ];
    for (id, extra, field) in refused {
        let body =
            format!(r#"{{"specversion":"1.0","id":"{id}","source":"s","type":"t",{extra}}}"#);
        let (status, answer) = d.post(ce, body).await;
        assert_eq!(
            (status, answer["field"].as_str()),
            (400, Some(*field)),
            "{id}: {answer}"
        );
        assert!(!stored(&d, id).await, "{id} must not be stored");
    }
    // A numeric or object id: 400 naming it.
    for id in ["7", r#"{"a":1}"#] {
        let body = format!(r#"{{"specversion":"1.0","id":{id},"source":"s","type":"t"}}"#);
        let (status, answer) = d.post(ce, body).await;
        assert_eq!(
            (status, answer["field"].as_str()),
            (400, Some("id")),
            "{answer}"
        );
    }
    // In a batch the index is named too, and nothing of the batch is stored.
    let (status, answer) = d
        .post(
            "application/cloudevents-batch+json",
            r#"[{"specversion":"1.0","id":"bt-ok","source":"s","type":"t"},
                {"specversion":"1.0","id":"bt-bad","source":"s","type":"t","datacontenttype":"xyz"}]"#,
        )
        .await;
    assert_eq!(
        (status, answer["field"].as_str()),
        (400, Some("[1].datacontenttype")),
        "{answer}"
    );
    assert!(!stored(&d, "bt-ok").await);

    // Accepted: the edges of each rule.
    let accepted: &[(&str, &str)] = &[
        (
            "ok-ct",
            r#""datacontenttype":"text/plain; charset=utf-8","data":"hi""#,
        ),
        ("ok-ds", r#""dataschema":"https://example.com/schema.json""#),
        ("ok-max", r#""count":2147483647"#),
        ("ok-min", r#""count":-2147483648"#),
        ("ok-bool", r#""flag":true"#),
        ("ok-seq", r#""partitionkey":"seqs","sequence":4294967296"#),
        ("ok-time", r#""time":"2024-05-01T18:31:00+05:30""#),
    ];
    for (id, extra) in accepted {
        let body =
            format!(r#"{{"specversion":"1.0","id":"{id}","source":"s","type":"t",{extra}}}"#);
        let (status, answer) = d.post(ce, body).await;
        assert_eq!(status, 201, "{id}: {answer}");
        assert!(stored(&d, id).await);
    }

    // An empty batch is a valid batch: 200, no events, nothing stored.
    let before = d.metrics_text().await;
    let (status, answer) = d.post("application/cloudevents-batch+json", "[]").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"events": []}));
    let stored_series = |text: &str| {
        text.lines()
            .filter(|l| l.contains("ingest") && l.contains("stored") && !l.starts_with('#'))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        stored_series(&d.metrics_text().await),
        stored_series(&before)
    );
    d.stop().await;
    db.cleanup().await;
}

async fn events_are_delivered_and_readable(backend: Backend) {
    let receiver = Receiver::start().await;
    let plugins = PluginsDir::new();
    plugins.add_webhook_to("webhook", &receiver);
    let (db, d) = daemon(backend, plugins.path()).await;
    let batch: Vec<_> = (0..9)
        .map(|i| {
            event(
                &format!("e{i}"),
                &format!("s{}", i % 3),
                "t",
                json!({"i": i}),
            )
        })
        .collect();
    let (status, body) = d
        .post(
            "application/cloudevents-batch+json",
            serde_json::to_vec(&batch).unwrap(),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert!(eventually(Duration::from_secs(20), || receiver.seen().len() >= 9).await);
    let done = d
        .wait_delivery("e8", Duration::from_secs(10), |x| {
            x["status"] == "delivered"
        })
        .await;
    assert_eq!(done["sink"], "webhook");
    assert_eq!(done["attempts"], 1);
    let (_, got) = d.get("/v1/events/e8").await;
    assert_eq!(got["event"]["data"], json!({"i": 8}));
    assert_eq!(got["event"]["partitionkey"], "s2");
    assert_eq!(got["event"]["sequence"], 3);
    d.stop().await;
    db.cleanup().await;
}

use common::both_stores;

both_stores!(
    bad_input_is_refused_naming_the_field,
    events_are_delivered_and_readable,
    cloudevents_attribute_rules_are_kept
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn routes_pick_sinks_and_an_unmatched_event_is_stored_without_deliveries() {
    // The receiver and the plugins folder live to the end of the test.
    let (d, _receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .config(|c| {
            c.routes = Some(vec![Route {
                types: vec!["com.github.*".into()],
                streams: vec!["*".into()],
                sinks: vec!["webhook".into()],
            }]);
        })
        .start()
        .await
        .single();
    let ce = "application/cloudevents+json";
    d.post(
        ce,
        serde_json::to_vec(&event("gh", "s", "com.github.push", json!({}))).unwrap(),
    )
    .await;
    d.post(
        ce,
        serde_json::to_vec(&event("other", "s", "com.example.x", json!({}))).unwrap(),
    )
    .await;
    d.wait_delivery("gh", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    let (status, got) = d.get("/v1/events/other").await;
    assert_eq!(status, 200, "an unmatched event is stored and visible");
    assert_eq!(got["deliveries"], json!([]));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_route_naming_an_unknown_sink_stops_the_start_naming_the_route() {
    let plugins = PluginsDir::new();
    let data = tempfile::tempdir().unwrap();
    let config = outboxd::config::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data.path().to_path_buf(),
        plugins_dir: plugins.path().to_path_buf(),
        routes: Some(vec![Route {
            types: vec!["*".into()],
            streams: vec!["*".into()],
            sinks: vec!["nosuch".into()],
        }]),
        ..Default::default()
    };
    let err = outboxd::daemon::Daemon::start(config, outboxd::daemon::Migrations::Apply)
        .await
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("routes[0]") && text.contains("nosuch"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_with_pending_migrations_is_refused_naming_them() {
    use sqlx::Connection;
    let db = TestDb::new(Backend::Postgres).await;
    db.store().await; // migrated
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    // Pretend the database predates migration 1.
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 1")
        .execute(&mut conn)
        .await
        .unwrap();
    let plugins = PluginsDir::new();
    let config = outboxd::config::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        database_url: Some(db.url.clone()),
        plugins_dir: plugins.path().to_path_buf(),
        ..Default::default()
    };
    let err = outboxd::daemon::Daemon::start(config, outboxd::daemon::Migrations::RequireCurrent)
        .await
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("pending migrations") && text.contains("1_initial"),
        "{text}"
    );
    db.cleanup().await;
}

async fn a_chained_sink_takes_an_event_only_after_its_predecessor_delivered_it(backend: Backend) {
    let first = Receiver::start().await;
    let second = Receiver::start().await;
    first.script(503, &[], "busy");
    first.script(503, &[], "busy");
    let plugins = PluginsDir::new();
    plugins.add_webhook_to("first", &first);
    plugins.add_webhook_to("second", &second);
    let manifest = plugins.path().join("second.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, format!("after = \"first\"\n{text}")).unwrap();
    let (db, d) = daemon(backend, plugins.path()).await;
    let batch: Vec<_> = (0..4)
        .map(|i| event(&format!("c{i}"), "chain", "t", json!({"i": i})))
        .collect();
    d.post(
        "application/cloudevents-batch+json",
        serde_json::to_vec(&batch).unwrap(),
    )
    .await;
    assert!(
        eventually(Duration::from_secs(30), || second.seen().len() >= 4).await,
        "second got {}",
        second.seen().len()
    );
    // Every event reached `second` only after `first` acknowledged it.
    let first_ok: std::collections::BTreeMap<String, std::time::Instant> = first
        .seen()
        .into_iter()
        .skip(2) // the two 503s
        .map(|r| (r.header("ce-id").unwrap(), r.at))
        .collect();
    let mut last = 0;
    for r in second.seen() {
        let id = r.header("ce-id").unwrap();
        let acked = first_ok
            .get(&id)
            .unwrap_or_else(|| panic!("{id} reached second before first delivered it"));
        assert!(
            r.at >= *acked,
            "{id} reached second before first acknowledged it"
        );
        let seq: u64 = r.header("ce-sequence").unwrap().parse().unwrap();
        assert!(seq > last, "order kept at the chained sink");
        last = seq;
    }
    d.stop().await;
    db.cleanup().await;
}

mod chained {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        a_chained_sink_takes_an_event_only_after_its_predecessor_delivered_it(Backend::Sqlite).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        a_chained_sink_takes_an_event_only_after_its_predecessor_delivered_it(Backend::Postgres)
            .await
    }
}
