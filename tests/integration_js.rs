//! A sink written in JavaScript (`plugins/js-log`, built from source with
//! componentize-js) runs in the daemon like a Rust one: its `init` checks
//! its configuration, its `deliver` answers per event.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_javascript_sink_delivers_rejects_and_refuses_bad_configuration() {
    init_logs();
    let built = built_js_plugins();
    let plugins = PluginsDir::new();
    std::fs::copy(
        built.join("js-log.wasm"),
        plugins.path().join("js-log.wasm"),
    )
    .unwrap();
    let manifest = std::fs::read_to_string(built.join("js-log.toml")).unwrap();
    plugins.write("js-log.toml", manifest.as_bytes());
    // The same component under another name, with a configuration its
    // `init` refuses.
    plugins.write(
        "js-misconfigured.toml",
        manifest
            .replace("name = \"js-log\"", "name = \"js-misconfigured\"")
            .replace("strict = \"true\"", "strict = \"maybe\"")
            .replace(
                "[limits]",
                "[retry]\nbase = \"100ms\"\ncap = \"200ms\"\n[limits]",
            )
            .as_bytes(),
    );
    let d = TestDaemon::start(plugins.path()).await;
    let (status, ready) = d.get("/ready").await;
    assert_eq!(status, 200, "{ready}");

    let mut batch: Vec<_> = (0..3)
        .map(|i| event(&format!("ok-{i}"), "s", "t", json!({ "i": i })))
        .collect();
    batch.push(json!({
        "specversion": "1.0", "id": "garbled", "source": "s", "type": "t",
        "partitionkey": "g", "datacontenttype": "application/json",
        "data_base64": "bm90IGpzb24=",
    }));
    d.post_batch(&batch).await;

    for i in 0..3 {
        let done = d
            .wait_sink(&format!("ok-{i}"), "js-log", Duration::from_secs(60), |x| {
                x["status"] == "delivered"
            })
            .await;
        assert_eq!(done["attempts"], 1, "{done}");
    }
    let dead = d
        .wait_sink("garbled", "js-log", Duration::from_secs(30), |x| {
            x["status"] == "dead"
        })
        .await;
    let reason = dead["last_error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("rejected: data is not valid JSON"),
        "{dead}"
    );

    let refused = d
        .wait_sink("ok-0", "js-misconfigured", Duration::from_secs(30), |x| {
            x["attempts"].as_u64().unwrap_or(0) >= 2
        })
        .await;
    // Kept (pending, retrying or leased for its next attempt) until the
    // configuration is fixed: never delivered, never dead-lettered.
    assert!(
        refused["status"] != "dead" && refused["status"] != "delivered",
        "kept for a fixed configuration: {refused}"
    );
    assert!(
        refused["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("plugin init failed: config key `strict` must be true or false, got `maybe`"),
        "{refused}"
    );
    d.stop().await;
}
