//! Hot reload of the plugins directory, with the real `webhook` component
//! and a real HTTP receiver: a replacement takes over under load, a broken
//! replacement leaves the old version serving, a removed plugin parks its
//! deliveries until it returns, a new plugin starts delivering.
//!
//! Which version delivered a request is told by its signature: each version
//! of the manifest signs with its own secret.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use serde_json::json;

/// How long a change in the plugins directory may take to be acted on
/// (debounce, compile from the cache, hand-over) on a busy machine.
const RELOAD: Duration = Duration::from_secs(20);

/// Post `events` events round-robin over `streams` streams, `per_post` per
/// request, with ids `{prefix}-{n}`.
async fn post_events(d: &TestDaemon, prefix: &str, events: usize, streams: usize, per_post: usize) {
    let all: Vec<_> = (0..events)
        .map(|n| {
            event(
                &format!("{prefix}-{n}"),
                &format!("{prefix}/{}", n % streams),
                "com.example.changed",
                json!({ "n": n }),
            )
        })
        .collect();
    for chunk in all.chunks(per_post) {
        d.post_batch(chunk).await;
    }
}

/// The `state` the admin API reports for `sink`.
async fn sink_state(d: &TestDaemon, sink: &str) -> String {
    let (status, body) = d.get("/v1/admin/sinks").await;
    assert_eq!(status, 200, "{body}");
    body["sinks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sink"] == sink)
        .map(|s| s["state"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// `outboxd_plugin_load_failures_total` for `plugin`, from `/metrics`.
async fn load_failures(d: &TestDaemon, plugin: &str) -> u64 {
    let text = d.metrics_text().await;
    let prefix = format!("outboxd_plugin_load_failures_total{{plugin=\"{plugin}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|n| n.trim().parse().unwrap())
        .unwrap_or(0)
}

async fn wait_state(d: &TestDaemon, sink: &str, want: &str) {
    let start = std::time::Instant::now();
    loop {
        let state = sink_state(d, sink).await;
        if state == want {
            return;
        }
        assert!(
            start.elapsed() < RELOAD,
            "sink {sink} did not become {want} within {RELOAD:?} (state {state:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replaced_plugin_takes_over_under_load_losing_and_duplicating_nothing() {
    init_logs();
    let (
        d,
        Hook {
            receiver,
            secret: old_secret,
            ..
        },
        plugins,
    ) = Harness::new()
        .webhook("hook", "")
        .start()
        .await
        .single_hook();
    receiver.set_delay(Duration::from_millis(5));
    let new_secret = new_secret();

    const EVENTS: usize = 600;
    const STREAMS: usize = 12;
    let producer = {
        let (base, http) = (d.base.clone(), d.http.clone());
        tokio::spawn(async move {
            for part in 0..6 {
                let all: Vec<_> = (part * 100..(part + 1) * 100)
                    .map(|n| {
                        event(
                            &format!("e-{n}"),
                            &format!("s/{}", n % STREAMS),
                            "com.example.changed",
                            json!({ "n": n }),
                        )
                    })
                    .collect();
                for chunk in all.chunks(10) {
                    let r = http
                        .post(format!("{base}/v1/events"))
                        .header("content-type", "application/cloudevents-batch+json")
                        .body(serde_json::to_vec(chunk).unwrap())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        })
    };
    // Replace the plugin while events flow: a new version, a new secret.
    assert!(eventually(RELOAD, || receiver.count() >= 60).await);
    plugins.add_webhook(
        "hook",
        &receiver.url(),
        &[receiver.origin()],
        &new_secret,
        "# 0.2\n",
    );
    producer.await.unwrap();
    assert!(
        eventually(Duration::from_secs(60), || {
            let ids: std::collections::BTreeSet<String> = receiver
                .seen()
                .iter()
                .filter_map(|r| r.header("ce-id"))
                .collect();
            ids.len() >= EVENTS
        })
        .await,
        "not every event arrived: {} requests",
        receiver.count()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let seen = receiver.seen();
    let mut per_stream: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let (mut by_old, mut by_new) = (0, 0);
    let mut last_by_new = false;
    for r in &seen {
        let old = verify_signature(&old_secret, r);
        let new = verify_signature(&new_secret, r);
        assert!(old || new, "a request signed by neither version");
        if old {
            by_old += 1;
        } else {
            by_new += 1;
        }
        last_by_new = new;
        per_stream
            .entry(r.header("ce-partitionkey").unwrap())
            .or_default()
            .push(r.header("ce-sequence").unwrap().parse().unwrap());
    }
    assert!(by_old > 0 && by_new > 0, "old {by_old}, new {by_new}");
    assert!(last_by_new, "the last delivery came from the old version");
    let duplicates = seen.len() - EVENTS;
    assert_eq!(duplicates, 0, "a reload re-delivered {duplicates} events");
    for (stream, seqs) in &per_stream {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "stream {stream} out of order: {seqs:?}"
        );
    }
    let (status, ready) = d.get("/ready").await;
    assert_eq!(status, 200, "{ready}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broken_replacement_is_refused_and_the_old_version_keeps_serving() {
    init_logs();
    let h = Harness::new().webhook("hook", "").start().await;
    let secret = h.hook("hook").secret.clone();
    let (d, receiver, plugins) = h.single();
    post_events(&d, "before", 5, 1, 5).await;
    assert!(eventually(RELOAD, || receiver.count() == 5).await);

    // The manifest now names a component that is not WebAssembly.
    plugins.write("broken.wasm", b"this is not a component");
    let manifest = std::fs::read_to_string(plugins.path().join("hook.toml")).unwrap();
    plugins.write(
        "hook.toml",
        manifest
            .replace("webhook.wasm", "broken.wasm")
            .replace("0.1.0\"\ncomponent", "0.2.0\"\ncomponent")
            .as_bytes(),
    );
    let start = std::time::Instant::now();
    let refused = loop {
        let (status, ready) = d.get("/ready").await;
        let refused = ready["checks"]["plugins"]["refused"].clone();
        if status == 503 && refused.as_array().is_some_and(|a| !a.is_empty()) {
            break refused.to_string();
        }
        assert!(start.elapsed() < RELOAD, "refusal not reported: {ready}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(refused.contains("broken.wasm"), "{refused}");
    assert!(refused.contains("not a WebAssembly file"), "{refused}");
    assert!(refused.contains("keeps serving"), "{refused}");
    assert_eq!(sink_state(&d, "hook").await, "loaded");
    // One refusal per change: the rescan's own reads of the folder must not
    // set the watch off again (they once did, refusing the file forever).
    let before = load_failures(&d, "hook").await;
    assert!(before >= 1, "the refusal is counted");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        load_failures(&d, "hook").await,
        before,
        "the folder is rescanned without a change"
    );
    // A change elsewhere in the folder rescans it: the refused file, unchanged,
    // is still refused, but not loaded, logged or counted again.
    plugins.write("notes.txt", b"unrelated");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        load_failures(&d, "hook").await,
        before,
        "an unchanged refusal is counted again"
    );
    let (_, ready) = d.get("/ready").await;
    assert!(
        ready["checks"]["plugins"]["refused"]
            .to_string()
            .contains("broken.wasm"),
        "{ready}"
    );
    assert_eq!(sink_state(&d, "hook").await, "loaded");

    // The old version still delivers.
    post_events(&d, "during", 5, 1, 5).await;
    assert!(
        eventually(RELOAD, || receiver.count() == 10).await,
        "the old version stopped delivering: {} requests",
        receiver.count()
    );
    assert!(receiver.seen().iter().all(|r| verify_signature(&secret, r)));

    // A good manifest again: the refusal clears.
    plugins.write(
        "hook.toml",
        manifest
            .replace("0.1.0\"\ncomponent", "0.3.0\"\ncomponent")
            .as_bytes(),
    );
    let start = std::time::Instant::now();
    loop {
        let (status, ready) = d.get("/ready").await;
        if status == 200 {
            break;
        }
        assert!(start.elapsed() < RELOAD, "still not ready: {ready}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, sinks) = d.get("/v1/admin/sinks").await;
    assert_eq!(sinks["sinks"][0]["version"], "0.3.0", "{sinks}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removed_plugin_parks_its_deliveries_until_it_returns() {
    init_logs();
    let (d, receiver, plugins) = Harness::new()
        .webhook("hook", "")
        .config(|c| {
            // Routes name the sink, so events keep routing to it while removed.
            c.routes = Some(vec![outboxd::routing::Route {
                types: vec!["*".into()],
                streams: vec!["*".into()],
                sinks: vec!["hook".into()],
            }]);
        })
        .start()
        .await
        .single();

    let manifest = std::fs::read(plugins.path().join("hook.toml")).unwrap();
    std::fs::remove_file(plugins.path().join("hook.toml")).unwrap();
    wait_state(&d, "hook", "removed").await;
    let (_, sinks) = d.get("/v1/admin/sinks").await;
    assert_eq!(sinks["sinks"][0]["parked"], "sink removed", "{sinks}");

    post_events(&d, "parked", 6, 2, 6).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.count(), 0, "a removed sink delivered");
    for n in 0..6 {
        let delivery = d.delivery(&format!("parked-{n}"), "hook").await.unwrap();
        assert_eq!(delivery["status"], "pending", "{delivery}");
        assert_eq!(delivery["attempts"], 0, "{delivery}");
    }
    let (status, ready) = d.get("/ready").await;
    assert_eq!(status, 200, "a removed plugin is not a failure: {ready}");
    assert_eq!(ready["checks"]["plugins"]["removed"], json!(["hook"]));

    // It comes back: the parked deliveries go out, in order.
    plugins.write("hook.toml", &manifest);
    wait_state(&d, "hook", "loaded").await;
    assert!(
        eventually(RELOAD, || receiver.count() == 6).await,
        "parked deliveries did not resume: {}",
        receiver.count()
    );
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for r in receiver.seen() {
        let seq: u64 = r.header("ce-sequence").unwrap().parse().unwrap();
        let prev = last.insert(r.header("ce-partitionkey").unwrap(), seq);
        assert!(prev.is_none_or(|p| p < seq), "out of order after resuming");
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_dropped_in_while_running_loads_and_delivers() {
    init_logs();
    let (
        d,
        Hook {
            receiver: a,
            secret,
            ..
        },
        plugins,
    ) = Harness::new().webhook("a", "").start().await.single_hook();
    let b = Receiver::start().await;

    plugins.add_webhook("b", &b.url(), &[b.origin()], &secret, "");
    wait_state(&d, "b", "loaded").await;
    post_events(&d, "both", 4, 2, 4).await;
    assert!(
        eventually(RELOAD, || a.count() == 4 && b.count() == 4).await,
        "a got {}, b got {}",
        a.count(),
        b.count()
    );
    let metrics = d.metrics_text().await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "outboxd_plugin_loads_total{plugin=\"b\"} 1"),
        "{metrics}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renamed_manifest_keeps_serving_and_its_broken_edit_is_refused() {
    init_logs();
    let (d, receiver, plugins) = Harness::new().webhook("hook", "").start().await.single();

    let (old, new) = (
        plugins.path().join("hook.toml"),
        plugins.path().join("sink-hook.toml"),
    );
    std::fs::rename(&old, &new).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await; // a rescan: unchanged
    assert_eq!(sink_state(&d, "hook").await, "loaded");

    // A syntax error in the renamed file: refused, the running version stays.
    plugins.write("sink-hook.toml", b"name = \"hook\"\nversion = ");
    let start = std::time::Instant::now();
    loop {
        let (_, ready) = d.get("/ready").await;
        if ready["checks"]["plugins"]["refused"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            break;
        }
        assert!(start.elapsed() < RELOAD, "refusal not reported: {ready}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        sink_state(&d, "hook").await,
        "loaded",
        "a broken edit must not park the sink"
    );
    post_events(&d, "after", 3, 1, 3).await;
    assert!(eventually(RELOAD, || receiver.count() == 3).await);
    d.stop().await;
}

/// What an operator sees of a plugin's version and of a refused
/// replacement, from a daemon run as a process: `wasm_sha256` and the
/// fleet's `component_sha` are the `.wasm` file's SHA-256 as `sha256sum`
/// prints it, `manifest_sha` the manifest's; a refused replacement shows in `/v1/admin/sinks` and `outboxd sinks list` with its reason while
/// the running version serves; and the daemon logs when the refusal clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_replacement_shows_in_sinks_list_and_its_clearing_is_logged() {
    use sha2::Digest;
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start().await;
    let plugins = PluginsDir::new();
    plugins.add_webhook_to("hook", &receiver);
    let wasm = std::fs::read(plugins.path().join("webhook.wasm")).unwrap();
    let sha = hex::encode(sha2::Sha256::digest(&wasm));
    let data = tempfile::tempdir().unwrap();
    let listen = free_loopback_addr();
    let log = child_log("reload-refusal");
    let mut child = ChildDaemon::spawn(&ChildConfig {
        listen,
        database_url: db.url.clone(),
        plugins_dir: plugins.path().to_path_buf(),
        data_dir: data.path().to_path_buf(),
        env: Vec::new(),
        log: log.clone(),
    });
    child.wait_healthy(Duration::from_secs(60)).await;
    let http = reqwest::Client::new();
    let sinks = || async {
        let body: serde_json::Value = http
            .get(format!("{}/v1/admin/sinks", child.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["sinks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["sink"] == "hook")
            .cloned()
            .unwrap_or_else(|| panic!("no sink hook: {body}"))
    };
    let cli = || {
        let (data, listen) = (data.path().to_path_buf(), listen.to_string());
        async move {
            tokio::task::spawn_blocking(move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
                    .args(["sinks", "list", "--listen", &listen, "--data-dir"])
                    .arg(&data)
                    .output()
                    .unwrap()
            })
            .await
            .unwrap()
        }
    };

    // The sink's own line carries the .wasm's SHA-256; so does this
    // replica's heartbeat (within a beat), with the manifest's beside it.
    let manifest_sha = hex::encode(sha2::Sha256::digest(
        std::fs::read(plugins.path().join("hook.toml")).unwrap(),
    ));
    let start = std::time::Instant::now();
    let hook = loop {
        let hook = sinks().await;
        if !hook["replicas"].as_array().unwrap().is_empty() {
            break hook;
        }
        assert!(start.elapsed() < RELOAD, "no heartbeat: {hook}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(hook["wasm_sha256"], sha.as_str(), "{hook}");
    assert_eq!(hook["replicas"][0]["component_sha"], sha.as_str(), "{hook}");
    assert_eq!(
        hook["replicas"][0]["manifest_sha"],
        manifest_sha.as_str(),
        "{hook}"
    );
    assert!(hook["refused"].is_null(), "{hook}");

    // A replacement that is not WebAssembly: refused, and said so.
    let manifest = std::fs::read_to_string(plugins.path().join("hook.toml")).unwrap();
    plugins.write("broken.wasm", b"this is not a component");
    plugins.write(
        "hook.toml",
        manifest.replace("webhook.wasm", "broken.wasm").as_bytes(),
    );
    let start = std::time::Instant::now();
    let hook = loop {
        let hook = sinks().await;
        if hook["refused"].is_string() {
            break hook;
        }
        assert!(start.elapsed() < RELOAD, "refusal not shown: {hook}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(hook["state"], "loaded", "{hook}");
    let reason = hook["refused"].as_str().unwrap();
    assert!(reason.contains("not a WebAssembly file"), "{hook}");
    let out = cli().await;
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{listed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = listed
        .lines()
        .find(|l| l.starts_with("hook\t"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        line.contains("loaded, replacement refused (") && line.contains("not a WebAssembly file"),
        "{line}"
    );
    assert!(
        line.ends_with(&format!("\t{sha}")),
        "the running version's SHA-256: {line}"
    );

    // The good manifest back: the refusal clears, once, in the log.
    plugins.write("hook.toml", manifest.as_bytes());
    let start = std::time::Instant::now();
    while sinks().await["refused"].is_string() {
        assert!(start.elapsed() < RELOAD, "refusal did not clear");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let cleared: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("plugin refusal cleared"))
        .collect();
    assert_eq!(cleared.len(), 1, "{}", child.log_tail(40));
    assert!(
        cleared[0].contains("hook") && cleared[0].contains("not a WebAssembly file"),
        "{}",
        cleared[0]
    );
    child.terminate(Duration::from_secs(10)).await;
    db.cleanup().await;
}
