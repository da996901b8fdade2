//! The guest SDK (`plugins/sdk`) in a component built from source
//! (`tests/components/sdkpost`, which uses only the SDK): its blocking HTTP
//! helper and its mapping of answers to outcomes against a real receiver on
//! loopback, and a host denial coming back as a named retry, not a trap.
//! Run through `outboxd plugin run`, as an author would.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::*;
use serde_json::json;

async fn run(dir: &Path, url: &str, allow: &str, events: &[serde_json::Value]) -> Output {
    let wasm = dir.join("sdkpost.wasm");
    std::fs::copy(test_component("sdkpost"), &wasm).unwrap();
    std::fs::write(
        dir.join("sdkpost.toml"),
        format!(
            "name = \"sdkpost\"\nversion = \"1\"\nwit = \"outboxd:sink@0.1.0\"\n\
             [capabilities]\nhttp = [{allow:?}]\n[config]\nurl = {url:?}\n"
        ),
    )
    .unwrap();
    let file = dir.join("events.jsonl");
    let lines: Vec<String> = events.iter().map(|e| e.to_string()).collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
    command
        .args(["plugin", "run"])
        .arg(&wasm)
        .arg("--events")
        .arg(&file);
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn shown(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_posts_and_maps_each_answer_to_its_outcome() {
    let receiver = Receiver::start().await;
    receiver.script(200, &[], "");
    receiver.script(503, &[("retry-after", "4")], "");
    receiver.script(429, &[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")], "");
    receiver.script(422, &[], "field x is wrong");
    let dir = tempfile::tempdir().unwrap();
    let events: Vec<_> = (1..=4)
        .map(|i| event(&format!("e{i}"), &format!("s{i}"), "t", json!({ "i": i })))
        .collect();
    let out = run(dir.path(), &receiver.url(), &receiver.origin(), &events).await;
    let text = shown(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("e1 s1#1: delivered"), "{text}");
    assert!(
        text.contains("e2 s2#1: retry after 4000 ms: HTTP 503"),
        "{text}"
    );
    // An HTTP-date in the past: retry at once (0 ms), not never.
    assert!(
        text.contains("e3 s3#1: retry after 0 ms: HTTP 429"),
        "{text}"
    );
    assert!(
        text.contains("e4 s4#1: reject: HTTP 422: field x is wrong"),
        "{text}"
    );
    let seen = receiver.seen();
    assert_eq!(seen.len(), 4);
    let body: serde_json::Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(body, json!({ "i": 1 }));
    assert_eq!(
        seen[0].header("content-type").as_deref(),
        Some("application/json")
    );
    // The length is given, so the body is not sent chunked: a receiver
    // reading only Content-Length bodies gets it whole.
    for r in &seen {
        assert_eq!(
            r.header("content-length"),
            Some(r.body.len().to_string()),
            "{r:?}"
        );
        assert_eq!(r.header("transfer-encoding"), None, "{r:?}");
    }
}

/// A request the manifest's grant refuses is a configuration error: the
/// event is rejected at its first attempt with a reason naming the origin
/// and the grant, not retried for the retry window (nor a trap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_allow_list_refuses_is_rejected_naming_the_grant_not_retried() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Allowed: another port than the receiver's.
    let out = run(
        dir.path(),
        &receiver.url(),
        "http://127.0.0.1:9",
        &[event("d1", "s", "t", json!({}))],
    )
    .await;
    let text = shown(&out);
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("d1 s#1: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.starts_with("d1 s#1: reject: HTTP-request-denied by the manifest"),
        "{line}"
    );
    assert!(
        line.contains(&format!(
            "{} is not in the plugin's allow-list",
            receiver.origin()
        )) && line.contains("capabilities.http = [\"http://127.0.0.1:9\"]")
            && line.contains("request denied by host policy (HTTP-request-denied)"),
        "{line}"
    );
    assert_eq!(
        receiver.count(),
        0,
        "the denied request reached the receiver"
    );
}

/// In a daemon: dead at the first attempt, with that reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_daemon_dead_letters_a_denied_request_at_its_first_attempt() {
    init_logs();
    let receiver = Receiver::start().await;
    let (d, _plugins) = Harness::new()
        .component(
            "sdkpost",
            &test_component("sdkpost"),
            &format!(
                "[capabilities]\nhttp = [\"http://127.0.0.1:9\"]\n[config]\nurl = {:?}\n",
                receiver.url()
            ),
        )
        .start()
        .await
        .into_daemon();
    d.post_event(&event("dd1", "s", "t", json!({}))).await;
    let dead = d
        .wait_sink("dd1", "sdkpost", Duration::from_secs(30), |x| {
            x["status"] == "dead"
        })
        .await;
    assert_eq!(dead["attempts"], 1, "{dead}");
    let reason = dead["last_error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("HTTP-request-denied by the manifest")
            && reason.contains("capabilities.http = [\"http://127.0.0.1:9\"]"),
        "{dead}"
    );
    assert_eq!(receiver.count(), 0);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_error_is_named_as_the_wit_spells_it() {
    // Nothing listens there: the connection is refused.
    let closed = free_loopback_addr();
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &format!("http://{closed}/hook"),
        &format!("http://{closed}"),
        &[event("c1", "s", "t", json!({}))],
    )
    .await;
    let text = shown(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("c1 s#1: retry: connection refused (connection-refused)"),
        "{text}"
    );
    assert!(!text.contains("ErrorCode::"), "{text}");
}
