//! The `outboxd` command line as a user types it: global options before or
//! after the subcommand, admin commands that go through the running daemon
//! (the database only with `--offline`) and never create state, and the
//! same answers as the HTTP admin API on the same data.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn outboxd(args: &[&str]) -> Output {
    outboxd_in(Path::new("."), args)
}

/// `outboxd ARGS` run in the folder `cwd`, with no `OUTBOXD_*` variable
/// of the caller's.
fn outboxd_in(cwd: &Path, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OUTBOXD_") {
            command.env_remove(key);
        }
    }
    command
        .current_dir(cwd)
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("run outboxd")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn global_options_stand_before_or_after_the_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let migrated = outboxd(&["migrate", "--data-dir", data]);
    assert!(migrated.status.success(), "{}", text(&migrated));
    // Off a terminal, one plain line per migration on stderr, as each lands;
    // the answer on stdout names them all.
    let progress = String::from_utf8_lossy(&migrated.stderr);
    let stdout = String::from_utf8_lossy(&migrated.stdout);
    let applied: Vec<&str> = stdout
        .split(": applied ")
        .nth(1)
        .expect("stdout names the migrations applied")
        .trim()
        .split(", ")
        .collect();
    for (n, name) in applied.iter().enumerate() {
        let line = format!(
            "applying migrations: {} of {} ({name})",
            n + 1,
            applied.len()
        );
        assert!(progress.contains(&line), "no `{line}` in:\n{progress}");
    }
    for args in [
        vec!["dead", "list", "--data-dir", data, "--offline"],
        vec!["dead", "--data-dir", data, "--offline", "list"],
        vec!["--data-dir", data, "dead", "--offline", "list"],
        vec!["events", "show", "nope", "--offline", "--data-dir", data],
        vec!["events", "--offline", "--data-dir", data, "show", "nope"],
    ] {
        let out = outboxd(&args);
        let all = text(&out);
        assert!(
            !all.contains("unexpected argument"),
            "`outboxd {}` refused its option: {all}",
            args.join(" ")
        );
        if args.contains(&"events") {
            assert!(all.contains("no event with id \"nope\""), "{all}");
        } else {
            assert!(out.status.success(), "`outboxd {}`: {all}", args.join(" "));
        }
    }
}

#[test]
fn an_admin_command_where_no_database_exists_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for args in [
        vec!["events", "show", "some-id"],
        vec!["dead", "list"],
        vec!["sinks", "pause", "webhook"],
    ] {
        let mut args = args.clone();
        args.extend(["--data-dir", data.to_str().unwrap(), "--offline"]);
        let out = outboxd(&args);
        let all = text(&out);
        assert!(!out.status.success(), "{all}");
        assert!(all.contains("no database at"), "{all}");
        assert!(
            !data.exists(),
            "`outboxd {}` created {}",
            args.join(" "),
            data.display()
        );
    }
}

#[test]
fn a_read_only_command_in_a_fresh_folder_names_the_missing_database() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec!["events", "show", "some-id", "--offline"],
        vec!["dead", "list", "--offline"],
    ] {
        let out = outboxd_in(dir.path(), &args);
        let all = text(&out);
        assert!(!out.status.success(), "{all}");
        assert!(
            all.contains("no database at data/outboxd.db"),
            "`outboxd {}`: {all}",
            args.join(" ")
        );
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "`outboxd {}` created {:?}",
            args.join(" "),
            std::fs::read_dir(dir.path()).unwrap().collect::<Vec<_>>()
        );
    }
}

#[test]
fn without_a_daemon_a_command_says_so_and_names_offline_where_it_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    // Nothing listens on port 1.
    let listen = "127.0.0.1:1";
    for (args, offline) in [
        (vec!["events", "show", "some-id"], true),
        (vec!["dead", "list"], true),
        (vec!["sinks", "list"], true),
        (vec!["sinks", "pause", "webhook"], true),
        (vec!["sources", "list"], false),
        (vec!["backfill", "--sink", "webhook"], false),
        (vec!["destinations", "list"], false),
        (vec!["producers", "list"], false),
        (vec!["secrets", "status"], false),
    ] {
        let mut args = args.clone();
        args.extend(["--data-dir", data, "--listen", listen]);
        let out = outboxd(&args);
        let all = text(&out);
        assert!(!out.status.success(), "`outboxd {}`: {all}", args.join(" "));
        assert!(
            all.contains("no daemon answered at 127.0.0.1:1")
                && all.contains("goes through the running daemon"),
            "`outboxd {}`: {all}",
            args.join(" ")
        );
        assert_eq!(
            all.contains("give --offline"),
            offline,
            "`outboxd {}`: {all}",
            args.join(" ")
        );
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "`outboxd {}` created state",
            args.join(" ")
        );
    }
    // A command that needs the daemon refuses the flag.
    let out = outboxd(&["sources", "list", "--offline"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("--offline"), "{}", text(&out));
}

/// A daemon with one webhook sink whose receiver refuses (400), so every
/// event becomes a dead letter; `ids` posted (on stream `orders`) and dead.
async fn daemon_with_dead_letters(ids: &[&str]) -> (TestDaemon, Receiver, PluginsDir) {
    let (d, receiver, plugins) = Harness::new().webhook("webhook", "").start().await.single();
    for _ in ids {
        receiver.script(400, &[], "not today");
    }
    for id in ids {
        d.post_event(&event(id, "orders", "t", json!({"id": id})))
            .await;
    }
    for id in ids {
        d.wait_delivery(id, Duration::from_secs(20), |x| x["status"] == "dead")
            .await;
    }
    (d, receiver, plugins)
}

/// `outboxd ARGS --data-dir DATA --listen ADDR` against `d`, off the
/// async runtime.
async fn cli(d: &TestDaemon, args: &[&str]) -> Output {
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.extend([
        "--data-dir".to_string(),
        d.data.path().display().to_string(),
        "--listen".to_string(),
        d.base.trim_start_matches("http://").to_string(),
    ]);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        outboxd(&args)
    })
    .await
    .unwrap()
}

/// The CLI's stdout, which must have succeeded.
fn stdout_of(out: &Output) -> String {
    assert!(out.status.success(), "{}", text(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_and_the_admin_api_answer_alike() {
    let (d, _receiver, _plugins) = daemon_with_dead_letters(&["e1", "e2", "e3"]).await;

    // events show: the same JSON.
    let (status, http_event) = d.get("/v1/admin/events/e2").await;
    assert_eq!(status, 200, "{http_event}");
    let cli_event: Value =
        serde_json::from_str(&stdout_of(&cli(&d, &["events", "show", "e2"]).await)).unwrap();
    assert_eq!(cli_event, http_event);

    // dead list: the same dead letters, in the same order, by the same
    // limit rule.
    for (query, flags) in [("", vec![]), ("?limit=2", vec!["--limit", "2"])] {
        let (status, http_dead) = d.get(&format!("/v1/admin/dead{query}")).await;
        assert_eq!(status, 200, "{http_dead}");
        let expected: Vec<String> = http_dead["dead"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                format!(
                    "{}\t{}\t{}#{}\tattempts={}\t{}",
                    x["event_id"].as_str().unwrap(),
                    x["sink"].as_str().unwrap(),
                    x["stream"].as_str().unwrap(),
                    x["sequence"],
                    x["attempts"],
                    x["reason"].as_str().unwrap_or_default()
                )
            })
            .collect();
        let mut args = vec!["dead", "list"];
        args.extend(flags);
        let listed = stdout_of(&cli(&d, &args).await);
        let listed: Vec<&str> = listed.lines().collect();
        assert_eq!(listed, expected, "`outboxd {}`", args.join(" "));
    }
    let (status, refused) = d.get("/v1/admin/dead?limit=10001").await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["field"], "limit", "{refused}");
    let out = cli(&d, &["dead", "list", "--limit", "10001"]).await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("limit: must be 1 to 10000"),
        "{}",
        text(&out)
    );

    // sinks list: one line per sink the API lists, with its state, version
    // and the SHA-256 of its .wasm.
    let check_sinks = |http: &Value, cli: &str| {
        let expected: Vec<String> = http["sinks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                format!(
                    "{}\t{}\t{}\t{}\t{}",
                    s["sink"].as_str().unwrap(),
                    if s["paused"] == true {
                        "paused"
                    } else {
                        "active"
                    },
                    s["state"].as_str().unwrap(),
                    s["version"].as_str().unwrap_or("-"),
                    s["wasm_sha256"].as_str().unwrap_or("-")
                )
            })
            .collect();
        assert!(!expected.is_empty(), "{http}");
        assert_eq!(cli.lines().collect::<Vec<_>>(), expected);
    };
    let (_, http_sinks) = d.get("/v1/admin/sinks").await;
    check_sinks(&http_sinks, &stdout_of(&cli(&d, &["sinks", "list"]).await));
    // A pause by the CLI is what the API then shows, and the CLI too.
    stdout_of(&cli(&d, &["sinks", "pause", "webhook"]).await);
    let (_, http_sinks) = d.get("/v1/admin/sinks").await;
    assert_eq!(http_sinks["sinks"][0]["paused"], true, "{http_sinks}");
    check_sinks(&http_sinks, &stdout_of(&cli(&d, &["sinks", "list"]).await));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_user_lists_replays_and_is_told_what_was_wrong() {
    let (d, receiver, _plugins) = daemon_with_dead_letters(&["n1"]).await;
    // A mistyped time names the flag and the form expected.
    let out = cli(&d, &["dead", "list", "--since", "yesterday"]).await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("--since: expected an RFC 3339 time"),
        "{}",
        text(&out)
    );
    // A sink that does not exist is named, with the ones that do.
    let out = cli(&d, &["sinks", "pause", "webhok"]).await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("no sink named \"webhok\" (known: webhook)"),
        "{}",
        text(&out)
    );
    // Nothing matching is said so, not left blank.
    let out = cli(&d, &["dead", "list", "--sink", "other"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("no dead letters match"),
        "{}",
        text(&out)
    );
    // Replay: the receiver accepts now, and the event is delivered.
    receiver.clear_script();
    let replayed = stdout_of(&cli(&d, &["dead", "replay", "--event", "n1"]).await);
    assert_eq!(replayed.trim(), "replayed 1");
    d.wait_delivery("n1", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    let shown: Value =
        serde_json::from_str(&stdout_of(&cli(&d, &["events", "show", "n1"]).await)).unwrap();
    assert_eq!(shown["deliveries"][0]["status"], "delivered", "{shown}");
    assert_eq!(shown["stream"], "orders", "{shown}");
    // Backfill goes through the daemon, which has the routes: the event
    // has its delivery already, so nothing new.
    let backfilled = stdout_of(&cli(&d, &["backfill", "--sink", "webhook"]).await);
    assert_eq!(
        backfilled.trim(),
        "webhook: scanned 1 events, created 0 deliveries"
    );
    d.stop().await;
}
