//! A plugin author's way, outside the repository: `outboxd plugin new`
//! writes a project into a temporary folder, it builds with one command
//! (its unit tests pass natively), `outboxd plugin check` accepts the
//! component and `outboxd plugin run` shows each outcome and the plugin's
//! log lines with no database, and a daemon loads it and delivers. The
//! Rust project delivers to a real receiver on loopback; the JavaScript
//! and Python ones (log sinks) deliver and dead-letter data that is not
//! JSON.
//!
//! The builds are offline-friendly: cargo runs with `--offline`, from the
//! registry cache the shipped plugins filled (the same `wit-bindgen`,
//! `wasip2` and `httpdate` versions as plugins/); npm prefers its cache;
//! the Python build uses the componentize-py the shipped Python sink is
//! built with.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use serde_json::json;

fn outboxd(args: &[&str], env: &[(&str, String)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outboxd"));
    command.args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("run outboxd")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Run `cargo <args>` in `project` with its build output in `target`.
fn cargo(project: &Path, target: &Path, args: &[&str]) {
    // The registry cache holds what the shipped plugins use.
    built_plugins();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .arg("--offline")
        .current_dir(project)
        .env("CARGO_TARGET_DIR", target)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo {args:?} failed in {}:\n{}",
        project.display(),
        text(&out)
    );
}

#[test]
fn plugin_wit_writes_the_wit_the_binary_speaks() {
    let dir = tempfile::tempdir().unwrap();
    let out = outboxd(
        &[
            "plugin",
            "wit",
            "--out",
            dir.path().join("w").to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let written = std::fs::read_to_string(dir.path().join("w/sink.wit")).unwrap();
    let source = std::fs::read_to_string(repo_root().join("wit/sink.wit")).unwrap();
    assert_eq!(written, source);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_rust_project_builds_checks_runs_and_delivers_in_a_daemon() {
    init_logs();
    let dir = tempfile::tempdir().unwrap();
    let out = outboxd(
        &[
            "plugin",
            "new",
            "my-sink",
            "--lang",
            "rust",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let project = dir.path().join("my-sink");
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        "my-sink.toml",
        "README.md",
        "wit/sink.wit",
    ] {
        assert!(project.join(file).is_file(), "plugin new wrote no {file}");
    }

    // The README's one build command, its output in the folder the shipped
    // sinks build in (scripts/build-plugins.sh, the same release profile):
    // the dependencies they share are compiled once, and a rerun builds
    // incrementally.
    let target = repo_root().join("target/wasm");
    cargo(
        &project,
        &target,
        &["build", "--release", "--target", "wasm32-wasip2"],
    );
    cargo(&project, &target, &["test"]);
    let wasm: PathBuf = target.join("wasm32-wasip2/release/my_sink.wasm");
    let size = std::fs::metadata(&wasm).unwrap().len();
    assert!(
        size < 500_000,
        "the size-oriented profile was not applied: {size} bytes"
    );

    let receiver = Receiver::start().await;
    let env = [("MY_SINK_ORIGIN", receiver.origin())];
    let manifest = project.join("my-sink.toml");
    let out = outboxd(
        &[
            "plugin",
            "check",
            wasm.to_str().unwrap(),
            "--manifest",
            manifest.to_str().unwrap(),
        ],
        &env,
    );
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("init: ok") && report.contains("verdict: ok"),
        "{report}"
    );

    // `plugin run`: no database; each outcome and the plugin's log lines.
    let events = dir.path().join("events.jsonl");
    let line = |id: &str, stream: &str| {
        json!({"specversion": "1.0", "id": id, "source": "/demo", "type": "demo.created",
               "partitionkey": stream, "data": {"n": id}})
        .to_string()
    };
    std::fs::write(
        &events,
        format!(
            "{}\n{}\n{}\n",
            line("e1", "s1"),
            line("e2", "s1"),
            line("e3", "s2")
        ),
    )
    .unwrap();
    receiver.script(200, &[], "");
    receiver.script(503, &[("retry-after", "7")], "");
    receiver.script(200, &[], "");
    let receiver_for_run = receiver.clone();
    let (out, receiver) = tokio::task::spawn_blocking(move || {
        let out = outboxd(
            &[
                "plugin",
                "run",
                wasm.to_str().unwrap(),
                "--manifest",
                manifest.to_str().unwrap(),
                "--events",
                events.to_str().unwrap(),
            ],
            &env,
        );
        (out, receiver_for_run)
    })
    .await
    .unwrap();
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("e1 s1#1: delivered"), "{shown}");
    assert!(
        shown.contains("e2 s1#2: retry after 7000 ms: HTTP 503"),
        "{shown}"
    );
    assert!(shown.contains("e3 s2#1: delivered"), "{shown}");
    assert!(
        shown.contains("2 of 3 events delivered"),
        "the plugin's log line:\n{shown}"
    );
    let bodies: Vec<serde_json::Value> = receiver
        .seen()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    // Sent with its length, not chunked: a receiver reading only
    // Content-Length bodies gets each one whole.
    for r in receiver.seen() {
        assert_eq!(
            r.header("content-length"),
            Some(r.body.len().to_string()),
            "{r:?}"
        );
        assert_eq!(r.header("transfer-encoding"), None, "{r:?}");
    }
    assert_eq!(bodies[0]["id"], "e1");
    assert_eq!(bodies[0]["data"], json!({"n": "e1"}));
    assert_eq!(bodies[2]["stream"], "s2");

    // No answer: the reason is the `wasi:http` error code as the WIT
    // spells it, not Rust's debug text.
    let closed = format!("http://{}", free_loopback_addr());
    let refused_env = [("MY_SINK_ORIGIN", closed.clone())];
    let (wasm_path, manifest_path, events_path) = (
        target.join("wasm32-wasip2/release/my_sink.wasm"),
        project.join("my-sink.toml"),
        dir.path().join("events.jsonl"),
    );
    let out = tokio::task::spawn_blocking(move || {
        outboxd(
            &[
                "plugin",
                "run",
                wasm_path.to_str().unwrap(),
                "--manifest",
                manifest_path.to_str().unwrap(),
                "--events",
                events_path.to_str().unwrap(),
            ],
            &refused_env,
        )
    })
    .await
    .unwrap();
    let shown = text(&out);
    assert!(
        shown.contains("e1 s1#1: retry: connection-refused"),
        "{shown}"
    );
    assert!(!shown.contains("ErrorCode::"), "{shown}");

    // A daemon loads the same files from its plugins folder and delivers.
    std::env::set_var("MY_SINK_ORIGIN", receiver.origin());
    let before = receiver.count();
    let (wasm, manifest) = (
        target.join("wasm32-wasip2/release/my_sink.wasm"),
        project.join("my-sink.toml"),
    );
    let (d, _plugins) = Harness::new()
        .plugins(move |plugins| {
            std::fs::copy(&wasm, plugins.path().join("my-sink.wasm")).unwrap();
            std::fs::copy(&manifest, plugins.path().join("my-sink.toml")).unwrap();
        })
        .start()
        .await
        .into_daemon();
    d.post_event(&event("d1", "s9", "demo.created", json!({"k": 1})))
        .await;
    let done = d
        .wait_sink("d1", "my-sink", Duration::from_secs(30), |x| {
            x["status"] == "delivered"
        })
        .await;
    assert_eq!(done["attempts"], 1, "{done}");
    let last: serde_json::Value = serde_json::from_slice(&receiver.seen()[before].body).unwrap();
    assert_eq!(last["id"], "d1");
    assert_eq!(last["data"], json!({"k": 1}));
    d.stop().await;
}

/// Run `npm <args>` in `project`, from npm's cache when it holds the
/// packages (offline-friendly).
fn npm(project: &Path, args: &[&str]) -> String {
    let out = Command::new("npm")
        .args(args)
        .current_dir(project)
        .output()
        .expect("run npm (Node.js 18 or newer)");
    assert!(
        out.status.success(),
        "npm {args:?} failed in {}:\n{}",
        project.display(),
        text(&out)
    );
    text(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_javascript_project_builds_checks_runs_and_loads() {
    init_logs();
    let dir = tempfile::tempdir().unwrap();
    let out = outboxd(
        &[
            "plugin",
            "new",
            "js-sink",
            "--lang",
            "js",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let project = dir.path().join("js-sink");
    npm(
        &project,
        &[
            "install",
            "--prefer-offline",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
        ],
    );
    npm(&project, &["run", "build"]);
    let tests = npm(&project, &["test"]);
    assert!(
        tests.contains("# pass 3") && tests.contains("# fail 0"),
        "{tests}"
    );
    let wasm = project.join("js-sink.wasm");

    let out = outboxd(&["plugin", "check", wasm.to_str().unwrap()], &[]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("init: ok") && report.contains("verdict: ok"),
        "{report}"
    );
    assert!(
        !report.contains("wasi:http"),
        "the component must not import wasi:http:\n{report}"
    );

    let events = dir.path().join("events.jsonl");
    std::fs::write(
        &events,
        format!(
            "{}\n{}\n",
            event("j1", "s", "t", json!({"n": 1})),
            json!({"specversion": "1.0", "id": "j2", "source": "s", "type": "t",
                   "partitionkey": "s", "datacontenttype": "application/json",
                   "data_base64": "bm90IGpzb24="})
        ),
    )
    .unwrap();
    let out = outboxd(
        &[
            "plugin",
            "run",
            wasm.to_str().unwrap(),
            "--events",
            events.to_str().unwrap(),
        ],
        &[],
    );
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("j1 s#1: delivered"), "{shown}");
    assert!(
        shown.contains("j2 s#2: reject: data is not valid JSON"),
        "{shown}"
    );
    assert!(
        shown.contains("\\\"id\\\":\\\"j1\\\"") || shown.contains("{\"id\":\"j1\""),
        "the plugin's log line for j1:\n{shown}"
    );
    loads_and_delivers(&project, "js-sink").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_python_project_builds_checks_runs_and_loads() {
    init_logs();
    // The pinned componentize-py, installed by the project's own script
    // (the one the shipped Python sink is built with).
    built_py_plugins();
    let componentize = repo_root().join("target/py-venv/bin/componentize-py");
    let dir = tempfile::tempdir().unwrap();
    let out = outboxd(
        &[
            "plugin",
            "new",
            "py-sink",
            "--lang",
            "python",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let project = dir.path().join("py-sink");
    let out = Command::new(project.join("build.sh"))
        .env("COMPONENTIZE_PY", &componentize)
        .output()
        .expect("run build.sh");
    let built = text(&out);
    assert!(out.status.success(), "build.sh failed:\n{built}");
    assert!(
        built.contains("Ran 3 tests") && built.contains("OK"),
        "{built}"
    );
    let wasm = project.join("py-sink.wasm");

    let out = outboxd(&["plugin", "check", wasm.to_str().unwrap()], &[]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("init: ok") && report.contains("verdict: ok"),
        "{report}"
    );

    let events = dir.path().join("events.jsonl");
    std::fs::write(
        &events,
        format!(
            "{}\n{}\n",
            event("p1", "s", "t", json!({"n": 1})),
            json!({"specversion": "1.0", "id": "p2", "source": "s", "type": "t",
                   "partitionkey": "s", "datacontenttype": "application/json",
                   "data_base64": "bm90IGpzb24="})
        ),
    )
    .unwrap();
    let out = outboxd(
        &[
            "plugin",
            "run",
            wasm.to_str().unwrap(),
            "--events",
            events.to_str().unwrap(),
        ],
        &[],
    );
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("p1 s#1: delivered"), "{shown}");
    assert!(
        shown.contains("p2 s#2: reject: data is not valid JSON"),
        "{shown}"
    );
    assert!(
        shown.contains("{\"id\":\"p1\""),
        "the plugin's log line for p1:\n{shown}"
    );
}

/// A daemon loads `project`'s `NAME.wasm` and `NAME.toml` from its plugins
/// folder, delivers a JSON event and dead-letters one whose data is not JSON.
async fn loads_and_delivers(project: &Path, name: &str) {
    let files = [format!("{name}.wasm"), format!("{name}.toml")].map(|f| project.join(f));
    let (d, _plugins) = Harness::new()
        .plugins(move |plugins| {
            for file in &files {
                std::fs::copy(file, plugins.path().join(file.file_name().unwrap())).unwrap();
            }
        })
        .start()
        .await
        .into_daemon();
    d.post_batch(&[
        event("d-ok", "d", "t", json!({"k": 1})),
        json!({"specversion": "1.0", "id": "d-bad", "source": "s", "type": "t",
               "partitionkey": "e", "datacontenttype": "application/json",
               "data_base64": "bm90IGpzb24="}),
    ])
    .await;
    let done = d
        .wait_sink("d-ok", name, Duration::from_secs(60), |x| {
            x["status"] == "delivered"
        })
        .await;
    assert_eq!(done["attempts"], 1, "{done}");
    let dead = d
        .wait_sink("d-bad", name, Duration::from_secs(60), |x| {
            x["status"] == "dead"
        })
        .await;
    assert!(
        dead["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("data is not valid JSON"),
        "{dead}"
    );
    d.stop().await;
}
