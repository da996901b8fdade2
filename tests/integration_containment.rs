//! What a hostile plugin can still reach, and the caps that stop it: the
//! operator's log (forged lines, floods), the disk and the admin API
//! (unbounded reasons), its own quarantine (traps that come fast), and its
//! own stuck stream (a batch too big for its memory).
//!
//! Each test runs one component of `tests/components/` (built from source)
//! written to misbehave in one way, as sink `bad`, beside `webhook`, the
//! shipped sink posting to a real receiver on loopback; every event goes to
//! both, and every test checks that the webhook sink delivered each event
//! once whatever `bad` did. The log tests run the real `outboxd` binary as
//! a child process and read what it wrote.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::harness::HarnessBuilder;
use common::*;
use serde_json::{json, Value};

/// Short retries for the bad sink.
const FAST_RETRY: &str = "[retry]\nbase = \"100ms\"\ncap = \"500ms\"\n";

/// The `ce-id`s the receiver has seen.
fn received(receiver: &Receiver) -> Vec<String> {
    receiver
        .seen()
        .iter()
        .filter_map(|r| r.header("ce-id"))
        .collect()
}

/// Wait until the receiver has seen each of `ids`, and check it saw each
/// exactly once.
async fn healthy_sink_delivered_each_once(receiver: &Receiver, ids: &[String]) {
    let ok = eventually(Duration::from_secs(20), || {
        let seen: BTreeSet<String> = received(receiver).into_iter().collect();
        ids.iter().all(|id| seen.contains(id))
    })
    .await;
    assert!(
        ok,
        "the healthy sink did not deliver {ids:?}; received {:?}",
        received(receiver)
    );
    let mut got = received(receiver);
    got.sort();
    let mut want = ids.to_vec();
    want.sort();
    assert_eq!(got, want, "each event reaches the receiver exactly once");
}

/// A plugins folder with the webhook sink and `bad` running `component`.
fn plugins_with(receiver: &Receiver, component: &str, manifest: &str) -> PluginsDir {
    let plugins = PluginsDir::new();
    plugins.add_webhook_to("webhook", receiver);
    plugins.add_component("bad", &test_component(component), manifest);
    plugins
}

/// The harness with the webhook sink and `bad` running `component`.
fn harness_with(component: &str, manifest: &str) -> HarnessBuilder {
    let (component, manifest) = (test_component(component), manifest.to_string());
    Harness::new()
        .webhook("webhook", "")
        .plugins(move |plugins| plugins.add_component("bad", &component, &manifest))
}

/// A child `outboxd` on its own SQLite database, logging in `format`.
struct Child {
    daemon: ChildDaemon,
    http: reqwest::Client,
    log: std::path::PathBuf,
    _data: tempfile::TempDir,
}

impl Child {
    async fn start(name: &str, plugins: &Path, format: &str, env: &[(&str, &str)]) -> Child {
        let data = tempfile::tempdir().unwrap();
        let log = child_log(name);
        let mut vars = vec![
            ("OUTBOXD_LOG_FORMAT".to_string(), format.to_string()),
            (
                "OUTBOXD_DELIVERY__MAX_POLL_INTERVAL".to_string(),
                "200ms".to_string(),
            ),
            ("RUST_LOG".to_string(), "info".to_string()),
        ];
        vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let config = ChildConfig {
            listen: free_loopback_addr(),
            database_url: format!("sqlite://{}", data.path().join("outboxd.db").display()),
            plugins_dir: plugins.to_path_buf(),
            data_dir: data.path().to_path_buf(),
            env: vars,
            log: log.clone(),
        };
        let mut daemon = ChildDaemon::spawn(&config);
        daemon.wait_healthy(Duration::from_secs(60)).await;
        Child {
            daemon,
            http: reqwest::Client::new(),
            log,
            _data: data,
        }
    }

    async fn post(&self, id: &str, stream: &str) {
        let r = self
            .http
            .post(format!("{}/v1/events", self.daemon.base))
            .header("content-type", "application/cloudevents+json")
            .body(
                serde_json::to_vec(&event(id, stream, "com.example.t", json!({"id": id}))).unwrap(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "posting {id}");
    }

    async fn delivery(&self, id: &str, sink: &str) -> Value {
        let body: Value = self
            .http
            .get(format!("{}/v1/events/{id}", self.daemon.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["deliveries"]
            .as_array()
            .and_then(|d| d.iter().find(|x| x["sink"] == sink).cloned())
            .unwrap_or(Value::Null)
    }

    async fn wait_sink(&self, id: &str, sink: &str, check: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let d = self.delivery(id, sink).await;
            if check(&d) {
                return d;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{id} to {sink}: {d}\n{}",
                self.daemon.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap()).into_owned()
    }
}

/// Characters that end a line or steer a terminal, for some reader of a log.
fn breaks_or_steers(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

/// Run `logforge` beside the webhook sink in a child logging in `format`;
/// return the log once its deliveries were retried and then rejected.
async fn forged_log(format: &str) -> String {
    let receiver = Receiver::start().await;
    let plugins = plugins_with(&receiver, "logforge", FAST_RETRY);
    let child = Child::start(
        &format!("containment-forge-{format}"),
        plugins.path(),
        format,
        &[],
    )
    .await;
    let ids: Vec<String> = (0..3).map(|i| format!("forge-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        child.post(id, &format!("s/{i}")).await;
    }
    for id in &ids {
        let dead = child.wait_sink(id, "bad", |x| x["status"] == "dead").await;
        assert!(
            dead["last_error"]
                .as_str()
                .unwrap_or("")
                .contains("FORGED-REJECT"),
            "{dead}"
        );
    }
    healthy_sink_delivered_each_once(&receiver, &ids).await;
    // The dead letters' log lines are the last the plugin causes.
    let done = eventually(Duration::from_secs(5), || {
        child.log_text().matches("FORGED-REJECT").count() >= ids.len()
    })
    .await;
    assert!(done, "{}", child.daemon.log_tail(20));
    child.log_text()
}

/// Every line the guest's text reached must be one the host began: the
/// forged text only ever appears inside a line about plugin `bad`.
fn assert_no_forged_lines(log: &str, is_host_line: impl Fn(&str) -> bool) {
    for what in ["FORGED-LOG", "FORGED-RETRY", "FORGED-REJECT"] {
        assert!(log.contains(what), "the log never mentions {what}");
    }
    for line in log.lines() {
        if line.contains("FORGED") {
            assert!(
                is_host_line(line) && line.contains("bad"),
                "a guest string forged a line of its own: {line:?}"
            );
        }
        assert!(
            !line.starts_with("2026-12-01T00:00:00"),
            "forged line at column 0: {line:?}"
        );
        if let Some(c) = line.chars().find(|&c| breaks_or_steers(c)) {
            panic!("a raw {c:?} reached the log: {line:?}");
        }
    }
    // 4,096 line breaks in one message, three batches or more: a few dozen
    // lines in all, not thousands.
    let lines = log.lines().count();
    assert!(lines < 200, "the log has {lines} lines");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guest_strings_cannot_forge_text_log_lines() {
    let log = forged_log("text").await;
    // A host text line starts with its timestamp, then the level.
    assert_no_forged_lines(&log, |line| {
        let mut words = line.split_whitespace();
        let stamp = words.next().unwrap_or("");
        let level = words.next().unwrap_or("");
        time::OffsetDateTime::parse(stamp, &time::format_description::well_known::Rfc3339).is_ok()
            && ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level)
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guest_strings_cannot_forge_json_log_lines() {
    let log = forged_log("json").await;
    assert_no_forged_lines(&log, |line| {
        serde_json::from_str::<Value>(line).is_ok_and(|v| v["timestamp"].is_string())
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_flooding_its_log_is_held_to_its_rate_with_a_summary_of_what_was_dropped() {
    let receiver = Receiver::start().await;
    let plugins = plugins_with(&receiver, "logflood", FAST_RETRY);
    let child = Child::start("containment-flood", plugins.path(), "text", &[]).await;
    let started = Instant::now();
    let ids: Vec<String> = (0..3).map(|i| format!("flood-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        child.post(id, &format!("s/{i}")).await;
    }
    // Several batches of 5,000 lines each.
    child
        .wait_sink(&ids[0], "bad", |x| x["attempts"].as_u64() >= Some(6))
        .await;
    healthy_sink_delivered_each_once(&receiver, &ids).await;
    let elapsed = started.elapsed().as_secs_f64();
    let log = child.log_text();
    let flood = log.lines().filter(|l| l.contains("FLOOD line")).count();
    // outboxd::plugin::log_limit: 100 lines/s after a burst of 1,000 (and
    // 64 KiB/s after 256 KiB, which these 100-byte lines stay under).
    let allowed = 1_000.0 + 100.0 * elapsed;
    assert!(
        (flood as f64) <= allowed && flood >= 1_000,
        "{flood} flood lines in {elapsed:.1} s; at most {allowed:.0} allowed"
    );
    let summaries: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("plugin log over its rate"))
        .collect();
    assert!(!summaries.is_empty(), "no summary of the dropped lines");
    assert!(
        summaries
            .iter()
            .all(|l| l.contains("bad") && l.contains("dropped")),
        "{summaries:?}"
    );
    assert!(
        summaries.len() as f64 <= elapsed + 2.0,
        "at most one summary a second: {}",
        summaries.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reasons_are_cut_at_their_cap_and_the_cut_is_marked() {
    init_logs();
    let (d, receiver, _plugins) = harness_with("bigreason", FAST_RETRY).start().await.single();
    let ids: Vec<String> = (0..3).map(|i| format!("big-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        d.post_event(&event(id, &format!("s/{i}"), "t", json!({})))
            .await;
    }
    // The first attempt's retry reason, kept as `last_error`.
    let retrying = d
        .wait_sink(&ids[0], "bad", Duration::from_secs(10), |x| {
            x["attempts"] == 1 && x["last_error"].is_string()
        })
        .await;
    for id in &ids {
        let dead = d
            .wait_sink(id, "bad", Duration::from_secs(10), |x| {
                x["status"] == "dead"
            })
            .await;
        let reason = dead["last_error"].as_str().unwrap();
        // outboxd::plugin::guest_text::MAX_REASON_BYTES = 1024, plus the
        // "rejected: " prefix and the marker.
        assert!(reason.len() <= 1024 + 64, "{} bytes kept", reason.len());
        assert!(reason.starts_with("rejected: reject:xxx"), "{reason}");
        assert!(
            reason.ends_with(&format!("…[cut {} bytes]", (512 << 10) - 1024)),
            "the cut is marked with what was left out: {}",
            &reason[reason.len() - 40..]
        );
    }
    let retry_reason = retrying["last_error"].as_str().unwrap();
    if retry_reason.starts_with("retry:") {
        assert!(
            retry_reason.len() <= 1024 + 64,
            "{} bytes",
            retry_reason.len()
        );
        assert!(retry_reason.contains("…[cut "), "{retry_reason:.80}");
    }
    // Two dead letters in one answer: a few KiB, not a MiB.
    let r = d
        .http
        .get(format!("{}/v1/admin/dead?limit=2", d.base))
        .send()
        .await
        .unwrap();
    let bytes = r.bytes().await.unwrap();
    assert!(
        bytes.len() < 8 << 10,
        "{} bytes for two dead letters",
        bytes.len()
    );
    healthy_sink_delivered_each_once(&receiver, &ids).await;
    d.stop().await;
}

/// The value of `outboxd_plugin_quarantines_total{plugin="<plugin>"}`.
async fn quarantines(d: &TestDaemon, plugin: &str) -> f64 {
    let text = d.metrics_text().await;
    let prefix = format!("outboxd_plugin_quarantines_total{{plugin=\"{plugin}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plugins_that_trap_fast_are_quarantined_after_the_configured_number_of_batches() {
    init_logs();
    // Each fails its batch before (or instead of) answering.
    let bad = ["inittrap", "wrongcount", "exitzero", "bigrandom"];
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .plugins(move |plugins| {
            for component in bad {
                plugins.add_component(component, &test_component(component), FAST_RETRY);
            }
        })
        .config(|c| {
            c.delivery.quarantine_after_traps = 3;
            c.delivery.quarantine_backoff = Duration::from_secs(60);
        })
        .start()
        .await
        .single();
    // One request, so each sink's first claim takes all four and every
    // later batch is a retry: after each trap the next turn usually
    // claims nothing (its events wait for their backoff), and those empty
    // turns must not reset the count.
    let ids: Vec<String> = (0..4).map(|i| format!("q-{i}")).collect();
    let events: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| event(id, &format!("s/{i}"), "t", json!({})))
        .collect();
    d.post_batch(&events).await;
    for component in bad {
        let start = Instant::now();
        while quarantines(&d, component).await < 1.0 {
            let state = d.delivery(&ids[0], component).await;
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{component} was never quarantined: {state:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if component == "exitzero" {
            let state = d.delivery(&ids[0], component).await.unwrap();
            assert!(
                state["last_error"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("plugin trap: exit (status 0)"),
                "exit(0) has a kind of its own: {state}"
            );
        }
        // Quarantined: it stops trying (the quarantine lasts a minute).
        let attempts = d.delivery(&ids[0], component).await.unwrap()["attempts"].clone();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let later = d.delivery(&ids[0], component).await.unwrap();
        assert_eq!(
            later["attempts"], attempts,
            "{component} still claims: {later}"
        );
        assert!(
            ["pending", "retrying"].contains(&later["status"].as_str().unwrap_or("")),
            "nothing is lost: {later}"
        );
    }
    healthy_sink_delivered_each_once(&receiver, &ids).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quarantined_sink_says_so_in_the_admin_api_and_in_ready() {
    init_logs();
    let (d, receiver, plugins) = harness_with("panic", FAST_RETRY)
        .config(|c| {
            c.delivery.quarantine_after_traps = 2;
            c.delivery.quarantine_backoff = Duration::from_secs(60);
        })
        .start()
        .await
        .single();
    let ids: Vec<String> = (0..3).map(|i| format!("p-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        d.post_event(&event(id, &format!("s/{i}"), "t", json!({})))
            .await;
    }
    let start = Instant::now();
    let bad = loop {
        let (_, sinks) = d.get("/v1/admin/sinks").await;
        let bad = sinks["sinks"]
            .as_array()
            .and_then(|s| s.iter().find(|x| x["sink"] == "bad").cloned())
            .unwrap();
        if bad["state"] == "quarantined" {
            break bad;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "never quarantined: {bad}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let now_ms = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
    let q = &bad["quarantine"];
    assert_eq!(bad["loaded"], true, "{bad}");
    assert!(
        q["until_ms"].as_i64().unwrap() > now_ms + 50_000,
        "quarantined for the configured minute: {bad}"
    );
    assert!(q["until"].as_str().unwrap().ends_with('Z'), "{bad}");
    assert_eq!(q["reason"], "plugin trap: panic", "{bad}");
    assert_eq!(q["failed_batches"], 2, "{bad}");
    // /ready shows it, and stays ready: ingest is unaffected.
    let (status, ready) = d.get("/ready").await;
    assert_eq!(status, 200, "{ready}");
    let shown = &ready["checks"]["plugins"]["quarantined"]["bad"];
    assert_eq!(shown["reason"], "plugin trap: panic", "{ready}");
    assert_eq!(shown["until_ms"], q["until_ms"], "{ready}");
    // The CLI asks the daemon at its configured address.
    let cli = tokio::task::spawn_blocking({
        let listen = d.base.trim_start_matches("http://").to_string();
        let data = d.data.path().to_path_buf();
        let plugins = plugins.path().to_path_buf();
        move || {
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
            for (key, _) in std::env::vars_os() {
                if key.to_string_lossy().starts_with("OUTBOXD_") {
                    command.env_remove(key);
                }
            }
            command
                .args(["sinks", "list"])
                .env("OUTBOXD_LISTEN", listen)
                .env("OUTBOXD_DATA_DIR", data)
                .env("OUTBOXD_PLUGINS_DIR", plugins)
                .env("RUST_LOG", "error")
                .output()
                .expect("run outboxd sinks list")
        }
    })
    .await
    .unwrap();
    let out = String::from_utf8_lossy(&cli.stdout);
    assert!(
        cli.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let line = out
        .lines()
        .find(|l| l.starts_with("bad\t"))
        .unwrap_or_default();
    assert!(
        line.contains(&format!(
            "quarantined until {}",
            q["until"].as_str().unwrap()
        )) && line.contains("plugin trap: panic"),
        "outboxd sinks list: {out}"
    );
    let webhook_line = out
        .lines()
        .find(|l| l.starts_with("webhook\t"))
        .unwrap_or_default();
    assert!(!webhook_line.contains("quarantined"), "{out}");
    // The healthy sink is not quarantined, and delivered everything.
    let (_, sinks) = d.get("/v1/admin/sinks").await;
    let webhook = sinks["sinks"]
        .as_array()
        .and_then(|s| s.iter().find(|x| x["sink"] == "webhook").cloned())
        .unwrap();
    assert_eq!(webhook["state"], "loaded", "{webhook}");
    assert!(webhook["quarantine"].is_null(), "{webhook}");
    healthy_sink_delivered_each_once(&receiver, &ids).await;
    d.stop().await;
}

/// 900 KiB of JSON data.
fn big_data(i: usize) -> Value {
    json!({ "i": i, "pad": "a".repeat(900 << 10) })
}

/// With `bad` paused, post `n` big events on one stream, so its first
/// batch after resuming has them all; wait until `bad` delivered all and
/// return their deliveries to `bad`.
async fn big_events_all_delivered(d: &TestDaemon, receiver: &Receiver, n: usize) -> Vec<Value> {
    let admin = |action: &str| {
        d.http
            .post(format!("{}/v1/admin/sinks/bad/{action}", d.base))
            .send()
    };
    assert!(admin("pause").await.unwrap().status().is_success());
    // The loop reads the pause at most a second late (PAUSE_RECHECK).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ids: Vec<String> = (0..n).map(|i| format!("big-{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        d.post_event(&event(id, "one-stream", "t", big_data(i)))
            .await;
    }
    assert!(admin("resume").await.unwrap().status().is_success());
    let mut out = Vec::new();
    for id in &ids {
        out.push(
            d.wait_sink(id, "bad", Duration::from_secs(40), |x| {
                x["status"] == "delivered"
            })
            .await,
        );
    }
    healthy_sink_delivered_each_once(receiver, &ids).await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_that_runs_out_of_memory_is_halved_until_it_fits() {
    init_logs();
    // No byte budget to speak of: the first batch of 16 × 900 KiB, with
    // the guest's 3 copies, needs about 58 MiB of a 32 MiB cap.
    let manifest = format!(
        "[limits]\nmemory-mib = 32\nmax-batch = 16\nmax-batch-bytes = 1073741824\n{FAST_RETRY}"
    );
    let (d, receiver, _plugins) = harness_with("hungry", &manifest).start().await.single();
    let delivered = big_events_all_delivered(&d, &receiver, 16).await;
    assert!(
        delivered.iter().any(|x| x["attempts"].as_u64() > Some(1)),
        "the first batch ran out of memory: {delivered:?}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_batch_is_sized_by_bytes_as_well_as_by_count() {
    init_logs();
    // The default byte budget, 1/8 of 32 MiB: four events of 900 KiB.
    let manifest = format!("[limits]\nmemory-mib = 32\nmax-batch = 16\n{FAST_RETRY}");
    let (d, receiver, _plugins) = harness_with("hungry", &manifest).start().await.single();
    let delivered = big_events_all_delivered(&d, &receiver, 16).await;
    for x in &delivered {
        assert_eq!(x["attempts"], 1, "no batch ran out of memory: {x}");
    }
    assert!(
        !d.metrics_text()
            .await
            .contains("outboxd_plugin_traps_total{"),
        "no trap at all"
    );
    d.stop().await;
}

/// Two events through the misbehaving component `component` (with
/// `manifest`): each attempt fails as `plugin trap: answer too large`, the
/// events wait for their retry, and the healthy sink delivers them once.
async fn every_attempt_refused_as_too_large(component: &str, manifest: &str, prefix: &str) {
    let (d, receiver, _plugins) = harness_with(component, manifest).start().await.single();
    let ids: Vec<String> = (0..2).map(|i| format!("{prefix}-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        d.post_event(&event(id, &format!("s/{i}"), "t", json!({})))
            .await;
    }
    for id in &ids {
        let state = d
            .wait_sink(id, "bad", Duration::from_secs(30), |x| {
                x["attempts"].as_u64() >= Some(2) && x["last_error"].is_string()
            })
            .await;
        assert_eq!(
            state["last_error"], "plugin trap: answer too large",
            "{state}"
        );
        assert!(
            ["pending", "retrying", "leased"].contains(&state["status"].as_str().unwrap_or("")),
            "{state}"
        );
    }
    healthy_sink_delivered_each_once(&receiver, &ids).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_of_millions_of_outcomes_is_refused_before_the_host_copies_it() {
    init_logs();
    // Room for the guest to build 3,000,000 outcomes (about 96 MB as a
    // canonical-ABI list, more as its own vector).
    // outboxd::plugin::runtime::hostcall_fuel: at most 16 MiB for a batch
    // of one or two, charged before the host allocates; the answer is
    // refused as too large, not copied and then counted.
    let manifest = format!("[limits]\nmemory-mib = 512\n{FAST_RETRY}");
    every_attempt_refused_as_too_large("manyoutcomes", &manifest, "many").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_batch_records_aliasing_one_body_are_refused_before_the_host_copies_them() {
    init_logs();
    // 1,024 requests whose bodies are all the same 1 MiB: a gibibyte to
    // copy from a 64 MiB guest. The host copies a request's bytes out as it
    // reads the record, each charged to the hostcall fuel first.
    let manifest = format!(
        "[capabilities]\nhttp = [\"http://127.0.0.1:9\"]\n[limits]\nmemory-mib = 64\n{FAST_RETRY}"
    );
    every_attempt_refused_as_too_large("batchalias", &manifest, "alias").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_opening_sockets_without_wasi_http_reaches_nothing() {
    init_logs();
    // A real TCP listener and UDP socket on loopback that the guest aims at.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let addr = tcp.local_addr().unwrap();
    let udp = std::net::UdpSocket::bind(addr).unwrap();
    udp.set_nonblocking(true).unwrap();
    let manifest = format!("[config]\naddr = \"{addr}\"\n{FAST_RETRY}");
    let (d, receiver, _plugins) = harness_with("sockets", &manifest).start().await.single();
    let ids: Vec<String> = (0..2).map(|i| format!("sock-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        d.post_event(&event(id, &format!("s/{i}"), "t", json!({})))
            .await;
    }
    for id in &ids {
        let state = d
            .wait_sink(id, "bad", Duration::from_secs(20), |x| {
                x["status"] == "dead"
            })
            .await;
        let reason = state["last_error"].as_str().unwrap_or("");
        assert!(
            reason.contains("tcp:") && reason.contains("udp:"),
            "both socket kinds failed in the guest: {state}"
        );
        assert!(
            reason.to_ascii_lowercase().contains("denied") || reason.contains("ermission"),
            "refused as access denied: {state}"
        );
    }
    assert!(
        matches!(tcp.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the guest's TCP connection reached the listener"
    );
    let mut buf = [0u8; 16];
    assert!(
        matches!(udp.recv_from(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the guest's UDP datagram arrived"
    );
    healthy_sink_delivered_each_once(&receiver, &ids).await;
    d.stop().await;
}
