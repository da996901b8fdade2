//! `outboxd plugin run`: sample events through a plugin with no database
//! and no daemon, as a user runs it (the binary, on the shipped webhook
//! built from source, against a real receiver on loopback).

mod common;

use std::path::Path;
use std::process::Output;

use common::*;
use serde_json::json;

/// Run `outboxd plugin run` off the async runtime, so the receiver keeps
/// answering.
async fn run(wasm: &Path, events: &Path, extra: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
    command
        .args(["plugin", "run"])
        .arg(wasm)
        .arg("--events")
        .arg(events)
        .args(extra);
    tokio::task::spawn_blocking(move || command.output().expect("run outboxd plugin run"))
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

/// The shipped webhook in `dir`, granted `origin` (`https://127.0.0.1:PORT`)
/// only, with `config` as its `[config]` body.
fn webhook_to(dir: &Path, origin: &str, config: &str) -> std::path::PathBuf {
    let wasm = dir.join("webhook.wasm");
    std::fs::copy(built_plugins().join("webhook.wasm"), &wasm).unwrap();
    std::fs::write(
        dir.join("webhook.toml"),
        format!(
            "name = \"webhook\"\nversion = \"1\"\nwit = \"outboxd:sink@0.1.0\"\n\
             [capabilities]\nhttp = [{origin:?}]\n[config]\n{config}"
        ),
    )
    .unwrap();
    wasm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_outcome_and_the_plugins_log_lines_are_printed() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let wasm = webhook_to(
        dir.path(),
        &receiver.origin(),
        &format!("url = {:?}\nsecret = {:?}\n", receiver.url(), new_secret()),
    );
    let events = dir.path().join("events.jsonl");
    let lines: Vec<String> = [("a1", "a"), ("b1", "b"), ("c1", "c"), ("a2", "a")]
        .iter()
        .map(|(id, stream)| event(id, stream, "t", json!({ "id": id })).to_string())
        .collect();
    std::fs::write(&events, lines.join("\n\n")).unwrap();
    // The webhook sends different streams at once: answer by path order is
    // not fixed, so give every answer the same meaning per request count.
    receiver.script(503, &[("retry-after", "3")], "");
    receiver.script(400, &[], "no thanks");
    receiver.script(200, &[], "");
    let out = run(&wasm, &events, &["--log-level", "debug"]).await;
    let text = shown(&out);
    assert!(out.status.success(), "{text}");
    // Four events, three streams: a2 waits behind a1 (same stream).
    assert!(text.contains("a1 a#1: "), "{text}");
    assert!(text.contains("a2 a#2: "), "{text}");
    assert!(
        text.contains("b1 b#1: ") && text.contains("c1 c#1: "),
        "{text}"
    );
    assert!(text.contains("retry after 3000 ms: HTTP 503"), "{text}");
    assert!(text.contains("reject: HTTP 400: no thanks"), "{text}");
    assert!(text.contains("4 events: "), "{text}");
    // The webhook logs its batch summary at debug: shown at --log-level debug.
    assert!(
        text.contains("plugin=\"webhook\""),
        "no plugin log line:\n{text}"
    );
    let seen = receiver.count();
    assert!((3..=4).contains(&seen), "{seen} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_init_fails_the_run_with_inits_reason() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let wasm = webhook_to(
        dir.path(),
        &receiver.origin(),
        &format!("secret = {:?}\n", new_secret()),
    );
    let events = dir.path().join("events.jsonl");
    std::fs::write(&events, event("x1", "x", "t", json!({})).to_string()).unwrap();
    let out = run(&wasm, &events, &[]).await;
    let text = shown(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("x1 x#1: failed: plugin init failed: config key `url` is required"),
        "{text}"
    );
    assert_eq!(receiver.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_ingest_would_refuse_is_named_by_its_line() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let wasm = webhook_to(
        dir.path(),
        &receiver.origin(),
        &format!("url = {:?}\nsecret = {:?}\n", receiver.url(), new_secret()),
    );
    let events = dir.path().join("events.jsonl");
    std::fs::write(
        &events,
        format!(
            "{}\n{{\"specversion\":\"1.0\",\"source\":\"s\",\"type\":\"t\"}}\n",
            event("ok", "s", "t", json!({}))
        ),
    )
    .unwrap();
    let out = run(&wasm, &events, &[]).await;
    let text = shown(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("events.jsonl:2: id"), "{text}");
    assert_eq!(receiver.count(), 0, "nothing is sent when the input is bad");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_file_trusts_a_receiver_under_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = private_ca();
    let (addr, seen) = https_receiver(dir.path(), (&cert, &key)).await;
    let origin = format!("https://{addr}");
    let wasm = webhook_to(
        dir.path(),
        &origin,
        &format!("url = \"{origin}/hook\"\nsecret = {:?}\n", new_secret()),
    );
    let events = dir.path().join("events.jsonl");
    std::fs::write(&events, event("p1", "s", "t", json!({})).to_string()).unwrap();

    let out = run(&wasm, &events, &[]).await;
    let text = shown(&out);
    assert!(
        text.contains("p1 s#1: retry: TLS certificate error (TLS-certificate-error)"),
        "{text}"
    );
    assert!(seen.lock().unwrap().is_empty());

    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let out = run(&wasm, &events, &["--ca-file", ca_file.to_str().unwrap()]).await;
    let text = shown(&out);
    assert!(text.contains("p1 s#1: delivered"), "{text}");
    assert_eq!(seen.lock().unwrap().len(), 1);

    let out = run(&wasm, &events, &["--ca-file", "/nonexistent/ca.pem"]).await;
    assert!(!out.status.success());
    assert!(
        shown(&out).contains("egress.ca-file: /nonexistent/ca.pem: cannot be read"),
        "{}",
        shown(&out)
    );
}
