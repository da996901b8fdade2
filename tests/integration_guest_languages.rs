//! A sink written in another language than Rust runs in the daemon like a
//! Rust one: its `init` checks its configuration, its `deliver` answers
//! per event. One table row per language (`plugins/js-log`, built from
//! source with componentize-js; `plugins/py-log`, with componentize-py),
//! the same assertions for each.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use serde_json::json;

/// A guest language and its logging sink.
struct Language {
    /// As assertions name it.
    name: &'static str,
    /// Builds the language's sinks (once per test process) and returns the
    /// folder holding `<sink>.wasm` and `<sink>.toml`.
    build: fn() -> PathBuf,
    /// The logging sink (manifest `name`, and the file names).
    sink: &'static str,
    /// The same component under another name, given a configuration its
    /// `init` refuses.
    misconfigured: &'static str,
    /// What that refusal says.
    refusal: &'static str,
}

const LANGUAGES: &[Language] = &[
    Language {
        name: "JavaScript",
        build: built_js_plugins,
        sink: "js-log",
        misconfigured: "js-misconfigured",
        refusal: "plugin init failed: config key `strict` must be true or false, got `maybe`",
    },
    Language {
        name: "Python",
        build: built_py_plugins,
        sink: "py-log",
        misconfigured: "py-misconfigured",
        refusal: "plugin init failed: config key `strict` must be true or false",
    },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sink_in_each_guest_language_delivers_rejects_and_refuses_bad_configuration() {
    init_logs();
    for language in LANGUAGES {
        delivers_rejects_and_refuses_bad_configuration(language).await;
    }
}

async fn delivers_rejects_and_refuses_bad_configuration(language: &Language) {
    let Language {
        name: lang,
        sink,
        misconfigured,
        ..
    } = language;
    let built = (language.build)();
    let manifest = std::fs::read_to_string(built.join(format!("{sink}.toml"))).unwrap();
    // The same component under another name, with a configuration its
    // `init` refuses.
    let refusing = manifest
        .replace(
            &format!("name = \"{sink}\""),
            &format!("name = \"{misconfigured}\""),
        )
        .replace("strict = \"true\"", "strict = \"maybe\"")
        .replace(
            "[limits]",
            "[retry]\nbase = \"100ms\"\ncap = \"200ms\"\n[limits]",
        );
    let (sink_name, misconfigured_name) = (sink.to_string(), misconfigured.to_string());
    let (d, _plugins) = Harness::new()
        .plugins(move |plugins| {
            std::fs::copy(
                built.join(format!("{sink_name}.wasm")),
                plugins.path().join(format!("{sink_name}.wasm")),
            )
            .unwrap();
            plugins.write(&format!("{sink_name}.toml"), manifest.as_bytes());
            plugins.write(&format!("{misconfigured_name}.toml"), refusing.as_bytes());
        })
        .start()
        .await
        .into_daemon();
    let (status, ready) = d.get("/ready").await;
    assert_eq!(status, 200, "{lang}: {ready}");

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
            .wait_sink(&format!("ok-{i}"), sink, Duration::from_secs(60), |x| {
                x["status"] == "delivered"
            })
            .await;
        assert_eq!(done["attempts"], 1, "{lang}: {done}");
    }
    let dead = d
        .wait_sink("garbled", sink, Duration::from_secs(30), |x| {
            x["status"] == "dead"
        })
        .await;
    let reason = dead["last_error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("rejected: data is not valid JSON"),
        "{lang}: {dead}"
    );

    let refused = d
        .wait_sink("ok-0", misconfigured, Duration::from_secs(30), |x| {
            x["attempts"].as_u64().unwrap_or(0) >= 2
        })
        .await;
    // Kept (pending, retrying or leased for its next attempt) until the
    // configuration is fixed: never delivered, never dead-lettered.
    assert!(
        refused["status"] != "dead" && refused["status"] != "delivered",
        "{lang}: kept for a fixed configuration: {refused}"
    );
    assert!(
        refused["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains(language.refusal),
        "{lang}: {refused}"
    );
    d.stop().await;
}
