//! A misbehaving plugin never takes the daemon down.
//!
//! Each test runs a daemon in this process with two sinks: `bad`, one of the
//! tiny misbehaving components of `tests/components/` (built from source),
//! and `webhook`, the shipped sink posting to a real receiver on loopback.
//! Every event goes to both. The checks, for every kind of misbehaviour:
//!
//! - the daemon stays up: it answers, ingests, and stops when asked;
//! - the healthy sink keeps delivering the events posted meanwhile, each
//!   exactly once;
//! - the bad sink's deliveries are not lost: they stay pending, the head of
//!   each is tried again (attempts grow) and its `last_error` says what the
//!   plugin did (`plugin trap: deadline`, `... out of memory`, ...);
//! - a plugin that fails every attempt is dead-lettered once its retry
//!   window runs out, with the trap in the reason.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// Short retries for the bad sink: the tests watch it try again.
const FAST_RETRY: &str = "[retry]\nbase = \"100ms\"\ncap = \"500ms\"\n";

/// A daemon with the bad sink and the healthy one, and the healthy one's
/// receiver.
struct Scene {
    d: TestDaemon,
    receiver: Receiver,
    _plugins: PluginsDir,
    /// When the daemon was started.
    started: Instant,
}

impl Scene {
    /// Start a daemon with sink `bad` running test component `component`
    /// (manifest tables `manifest`) beside a `webhook` sink, both loaded.
    async fn start(component: &str, manifest: &str) -> Scene {
        // No quarantine: these scenes watch one misbehaving sink being
        // retried, and a quarantine (after 5 failed batches, which several
        // one-event streams reach quickly) would hold its attempts back for
        // 30 s. Quarantine has tests of its own (integration_containment).
        Scene::start_with(&[("bad", component, manifest)], |c| {
            c.delivery.quarantine_after_traps = u32::MAX;
        })
        .await
    }

    /// As [`Scene::start`], with several test-component sinks:
    /// `(sink, component, manifest tables)`. No quarantine either, for the
    /// same reason: whether five failed batches come before a head's second
    /// attempt depends on how the posts fall into batches.
    async fn start_many(sinks: &[(&str, &str, &str)]) -> Scene {
        Scene::start_with(sinks, |c| {
            c.delivery.quarantine_after_traps = u32::MAX;
        })
        .await
    }

    /// As [`Scene::start_many`], with the daemon's configuration adjusted.
    async fn start_with(
        sinks: &[(&str, &str, &str)],
        adjust: impl FnOnce(&mut outboxd::config::Config),
    ) -> Scene {
        init_logs();
        let receiver = Receiver::start().await;
        let plugins = PluginsDir::new();
        plugins.add_webhook_to("webhook", &receiver);
        for (sink, component, manifest) in sinks {
            plugins.add_component(sink, &test_component(component), manifest);
        }
        let started = Instant::now();
        let d = TestDaemon::start_with(plugins.path(), adjust).await;
        let (status, ready) = d.get("/ready").await;
        assert_eq!(status, 200, "every plugin must load: {ready}");
        let mut expected: Vec<&str> = sinks.iter().map(|s| s.0).chain(["webhook"]).collect();
        expected.sort();
        assert_eq!(
            ready["checks"]["plugins"]["loaded"],
            json!(expected),
            "{ready}"
        );
        Scene {
            d,
            receiver,
            _plugins: plugins,
            started,
        }
    }

    /// Post one event; it must be accepted.
    async fn post(&self, id: &str, stream: &str) {
        let body = serde_json::to_vec(&event(id, stream, "com.example.changed", json!({"id": id})))
            .unwrap();
        let (status, answer) = self.d.post("application/cloudevents+json", body).await;
        assert_eq!(status, 201, "posting {id}: {answer}");
    }

    /// The `ce-id`s the receiver has seen, in order.
    fn received(&self) -> Vec<String> {
        self.receiver
            .seen()
            .iter()
            .filter_map(|r| r.header("ce-id"))
            .collect()
    }

    /// Wait until the receiver has seen every one of `ids`.
    async fn wait_received(&self, ids: &[String], timeout: Duration) {
        let ok = eventually(timeout, || {
            let seen: BTreeSet<String> = self.received().into_iter().collect();
            ids.iter().all(|id| seen.contains(id))
        })
        .await;
        assert!(
            ok,
            "the healthy sink did not deliver {ids:?} within {timeout:?}; received {:?}",
            self.received()
        );
    }

    /// Stop the daemon; it must stop promptly even with a batch of the bad
    /// sink in flight.
    async fn stop(self) {
        let stopping = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), self.d.stop())
            .await
            .expect("the daemon stops within 10 s");
        eprintln!(
            "daemon ran {:?}, stopped in {:?}",
            self.started.elapsed(),
            stopping.elapsed()
        );
    }
}

fn attempts(x: &Value) -> u64 {
    x["attempts"].as_u64().unwrap_or(0)
}

fn last_error(x: &Value) -> &str {
    x["last_error"].as_str().unwrap_or("")
}

/// Still to be delivered: waiting for a retry, or claimed right now.
fn is_kept(x: &Value) -> bool {
    matches!(
        x["status"].as_str(),
        Some("pending" | "retrying" | "leased")
    )
}

/// The whole check for one bad component: the daemon stays up, the healthy
/// sink delivers what is posted while the bad one misbehaves, the bad one's
/// deliveries are kept and tried again with `last_error` containing
/// `expected`. Returns the scene for further checks.
async fn contained(component: &str, manifest: &str, expected: &str) -> Scene {
    let scene = Scene::start(component, manifest).await;
    let d = &scene.d;

    // The bad sink takes the first event and misbehaves with it.
    scene.post("first", "orders/1").await;
    d.wait_sink("first", "bad", Duration::from_secs(10), |x| {
        attempts(x) >= 1
    })
    .await;

    // Meanwhile the healthy sink delivers everything posted.
    let mut ids = vec!["first".to_string()];
    for i in 0..5 {
        let id = format!("later-{i}");
        scene.post(&id, &format!("users/{i}")).await;
        ids.push(id);
    }
    scene.wait_received(&ids, Duration::from_secs(10)).await;

    // The bad sink's delivery is kept, says what happened, and is tried
    // again.
    let state = d
        .wait_sink("first", "bad", Duration::from_secs(15), |x| {
            attempts(x) >= 2 && last_error(x).contains(expected)
        })
        .await;
    assert!(
        is_kept(&state),
        "the bad sink's delivery must stay pending: {state}"
    );
    assert!(last_error(&state).contains(expected), "{state}");

    // The daemon is up and answering.
    let (status, health) = d.get("/health").await;
    assert_eq!(status, 200, "{health}");
    scene.post("after", "orders/2").await;
    ids.push("after".to_string());
    scene.wait_received(&ids, Duration::from_secs(10)).await;

    for id in &ids {
        let bad = d
            .delivery(id, "bad")
            .await
            .unwrap_or_else(|| panic!("{id} has no delivery to the bad sink"));
        assert!(
            is_kept(&bad),
            "{id} to the bad sink must be neither delivered nor dead: {bad}"
        );
        let good = d
            .wait_sink(id, "webhook", Duration::from_secs(5), |x| {
                x["status"] == "delivered"
            })
            .await;
        assert_eq!(good["attempts"], 1, "{id}: {good}");
    }
    // Exactly once each at the receiver.
    let mut received = scene.received();
    received.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(
        received, want,
        "each event reaches the receiver exactly once"
    );
    scene
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_healthy_test_component_delivers_every_event_once() {
    let scene = Scene::start("ok", FAST_RETRY).await;
    let ids: Vec<String> = (0..5).map(|i| format!("ok-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        scene.post(id, &format!("s/{}", i % 2)).await;
    }
    for id in &ids {
        let bad = scene
            .d
            .wait_sink(id, "bad", Duration::from_secs(10), |x| {
                x["status"] == "delivered"
            })
            .await;
        assert_eq!(bad["attempts"], 1, "{bad}");
        assert!(bad["last_error"].is_null(), "{bad}");
    }
    scene.wait_received(&ids, Duration::from_secs(10)).await;
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_that_loops_forever_is_stopped_at_its_deadline() {
    let manifest = format!("[limits]\ndeadline = \"1s\"\n{FAST_RETRY}");
    contained("spin", &manifest, "plugin trap: deadline")
        .await
        .stop()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_plugin_that_loops_forever_does_not_starve_a_single_worker_thread() {
    // One worker thread for the daemon, the receiver and this test: the
    // spinning guest must give the thread back while it runs, so the
    // healthy sink delivers during the bad sink's very first attempt.
    init_logs();
    let manifest = format!("[limits]\ndeadline = \"3s\"\n{FAST_RETRY}");
    let scene = Scene::start("spin", &manifest).await;
    let d = &scene.d;
    scene.post("first", "orders/1").await;
    d.wait_sink("first", "bad", Duration::from_secs(10), |x| {
        attempts(x) >= 1
    })
    .await;
    let claimed = Instant::now();

    let mut ids = vec!["first".to_string()];
    for i in 0..3 {
        let id = format!("later-{i}");
        scene.post(&id, &format!("users/{i}")).await;
        ids.push(id);
    }
    scene.wait_received(&ids, Duration::from_secs(10)).await;
    let took = claimed.elapsed();
    let state = d.delivery("first", "bad").await.unwrap();
    assert!(
        attempts(&state) == 1 && state["last_error"].is_null(),
        "the healthy sink took {took:?}, longer than the bad sink's first attempt: {state}"
    );
    eprintln!("4 events delivered {took:?} into a 3 s spin");
    let state = d
        .wait_sink("first", "bad", Duration::from_secs(10), |x| {
            last_error(x).contains("plugin trap: deadline")
        })
        .await;
    assert!(is_kept(&state), "{state}");
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_that_allocates_without_bound_is_stopped_at_its_memory_cap() {
    let manifest = format!("[limits]\nmemory-mib = 16\n{FAST_RETRY}");
    contained("membomb", &manifest, "plugin trap: out of memory")
        .await
        .stop()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_that_panics_fails_its_batch_as_retryable() {
    contained("panic", FAST_RETRY, "plugin trap: panic")
        .await
        .stop()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_that_overflows_its_shadow_stack_reports_a_stack_overflow() {
    // Big frames: the guest's stack in linear memory runs out first.
    let manifest = format!("{FAST_RETRY}[config]\nframe = \"big\"\n");
    contained("stackoverflow", &manifest, "plugin trap: stack overflow")
        .await
        .stop()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_that_overflows_the_wasm_stack_reports_a_stack_overflow() {
    // Small frames: the engine's stack limit is hit first.
    let manifest = format!("{FAST_RETRY}[config]\nframe = \"small\"\n");
    contained("stackoverflow", &manifest, "plugin trap: stack overflow")
        .await
        .stop()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_that_answers_the_wrong_number_of_outcomes_fails_its_batch() {
    contained(
        "wrongcount",
        FAST_RETRY,
        "plugin trap: wrong number of outcomes",
    )
    .await
    .stop()
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_that_traps_on_every_attempt_is_dead_lettered_when_its_retry_window_runs_out() {
    let manifest = "[retry]\nbase = \"100ms\"\ncap = \"500ms\"\nwindow = \"2s\"\n";
    // No quarantine: this test watches the retry window, and a quarantine
    // (after 5 trapped batches) would hold the attempts back for 30 s.
    let scene = Scene::start_with(&[("bad", "panic", manifest)], |c| {
        c.delivery.quarantine_after_traps = u32::MAX;
    })
    .await;
    let started = Instant::now();
    scene.post("doomed", "orders/1").await;
    let dead = scene
        .d
        .wait_sink("doomed", "bad", Duration::from_secs(15), |x| {
            x["status"] == "dead"
        })
        .await;
    let reason = last_error(&dead);
    assert!(
        reason.contains("plugin trap: panic"),
        "the reason names the trap: {dead}"
    );
    assert!(
        reason.contains("retry window"),
        "the reason says the window ran out: {dead}"
    );
    assert!(
        attempts(&dead) >= 2,
        "it was retried before it was given up: {dead}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "not given up before its window: {dead}"
    );
    // The healthy sink delivered it regardless.
    scene
        .wait_received(&["doomed".to_string()], Duration::from_secs(5))
        .await;
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_kind_of_misbehaviour_at_once_harms_neither_the_healthy_sink_nor_each_other() {
    let spin = format!("[limits]\ndeadline = \"1s\"\n{FAST_RETRY}");
    let membomb = format!("[limits]\nmemory-mib = 16\n{FAST_RETRY}");
    let big = format!("{FAST_RETRY}[config]\nframe = \"big\"\n");
    let small = format!("{FAST_RETRY}[config]\nframe = \"small\"\n");
    let sinks: [(&str, &str, &str, &str); 8] = [
        ("spin", "spin", &spin, "plugin trap: deadline"),
        ("membomb", "membomb", &membomb, "plugin trap: out of memory"),
        ("panic", "panic", FAST_RETRY, "plugin trap: panic"),
        (
            "stack-big",
            "stackoverflow",
            &big,
            "plugin trap: stack overflow",
        ),
        (
            "stack-small",
            "stackoverflow",
            &small,
            "plugin trap: stack overflow",
        ),
        (
            "wrongcount",
            "wrongcount",
            FAST_RETRY,
            "plugin trap: wrong number of outcomes",
        ),
        (
            "resleak",
            "resleak",
            FAST_RETRY,
            "plugin trap: too many resources",
        ),
        ("ok", "ok", FAST_RETRY, ""),
    ];
    let specs: Vec<(&str, &str, &str)> = sinks.iter().map(|(s, c, m, _)| (*s, *c, *m)).collect();
    let scene = Scene::start_many(&specs).await;
    let d = &scene.d;

    let ids: Vec<String> = (0..6).map(|i| format!("all-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        scene.post(id, &format!("s/{}", i % 3)).await;
    }
    scene.wait_received(&ids, Duration::from_secs(10)).await;
    for id in &ids {
        let ok = d
            .wait_sink(id, "ok", Duration::from_secs(10), |x| {
                x["status"] == "delivered"
            })
            .await;
        assert_eq!(ok["attempts"], 1, "{ok}");
    }
    // The head of each stream, for each bad sink: kept, retried, and failed
    // for its own reason, not another sink's.
    for (sink, _, _, expected) in sinks.iter().filter(|s| s.0 != "ok") {
        for head in &ids[..3] {
            let state = d
                .wait_sink(head, sink, Duration::from_secs(15), |x| {
                    attempts(x) >= 2 && last_error(x).contains(expected)
                })
                .await;
            assert!(is_kept(&state), "{sink}: {state}");
        }
    }
    let mut received = scene.received();
    received.sort();
    assert_eq!(
        received, ids,
        "each event reaches the receiver exactly once"
    );
    scene.stop().await;
}

/// `name` (a test component) loaded into `runtime` with `limits`, as the
/// daemon loads a plugins folder.
fn load_test_plugin(
    runtime: &outboxd::plugin::Runtime,
    name: &str,
    limits: &str,
) -> outboxd::plugin::Plugin {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        test_component(name),
        dir.path().join(format!("{name}.wasm")),
    )
    .unwrap();
    let manifest = dir.path().join(format!("{name}.toml"));
    std::fs::write(
        &manifest,
        format!(
            "name = {name:?}\nversion = \"0.1.0\"\ncomponent = \"{name}.wasm\"\nwit = \"outboxd:sink@0.1.0\"\n{limits}"
        ),
    )
    .unwrap();
    outboxd::plugin::load_one(runtime, &manifest)
        .unwrap_or_else(|f| panic!("{}: {}", f.file.display(), f.reason))
}

fn plugin_event(id: &str) -> outboxd::plugin::bindings::Event {
    outboxd::plugin::bindings::Event {
        id: id.into(),
        source: "/pool".into(),
        type_: "t".into(),
        subject: None,
        stream: id.into(),
        sequence: 1,
        time: "2026-12-05T00:00:00Z".into(),
        datacontenttype: None,
        dataschema: None,
        data: b"{}".to_vec(),
        extensions: Vec::new(),
        attempt: 1,
        ingested_at: "2026-12-05T00:00:00Z".into(),
    }
}

/// Delivers one event named `id` through `plugin`, which must answer
/// `delivered`.
async fn assert_delivers_one(plugin: &outboxd::plugin::Plugin, id: &str) {
    let outcomes = plugin.deliver(&[plugin_event(id)]).await;
    assert!(
        matches!(
            outcomes.as_deref(),
            Ok([outboxd::plugin::bindings::Outcome::Delivered])
        ),
        "{outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_finds_the_instance_pool_full_runs_on_demand() {
    init_logs();
    // One slot, taken by a batch that computes until its 3 s deadline.
    let runtime = outboxd::plugin::Runtime::with_instance_pool(1).unwrap();
    let spin = load_test_plugin(&runtime, "spin", "[limits]\ndeadline = \"3s\"\n");
    let ok = load_test_plugin(&runtime, "ok", "");
    assert_eq!(runtime.pooled_instances(), Some(0));
    let held = tokio::spawn(async move { spin.deliver(&[plugin_event("held")]).await });
    assert!(
        eventually(Duration::from_secs(2), || runtime.pooled_instances()
            == Some(1))
        .await,
        "the spinning batch took the pool's slot"
    );
    // The pool is full: this batch is instantiated on demand, and answered.
    assert_delivers_one(&ok, "beside").await;
    assert!(
        !held.is_finished(),
        "answered while the slot was still held"
    );
    let spun = held.await.unwrap();
    assert!(
        matches!(
            &spun,
            Err(outboxd::plugin::SinkFailure::Trap {
                kind: outboxd::plugin::TrapKind::Deadline,
                ..
            })
        ),
        "{spun:?}"
    );
    // The slot is given back, and serves the next batch.
    assert_eq!(runtime.pooled_instances(), Some(0));
    assert_delivers_one(&ok, "after").await;
}

#[tokio::test]
async fn a_pool_the_address_space_cannot_hold_leaves_every_batch_on_demand() {
    init_logs();
    // 32,768 slots of two 4 GiB memories: some 256 TiB, past the 128 TiB
    // a Linux process can map (as a `ulimit -v` would refuse far less).
    let runtime = outboxd::plugin::Runtime::with_instance_pool(1 << 15)
        .expect("a runtime starts without its pool");
    assert_eq!(runtime.pooled_instances(), None, "no pool was reserved");
    assert_eq!(runtime.pool_slots(), 0, "a pool of no slots is reported");
    let ok = load_test_plugin(&runtime, "ok", "");
    assert_delivers_one(&ok, "on demand").await;
}

#[test]
fn every_shipped_sink_starts_with_the_memory_a_batch_needs() {
    // plugins/initial-memory.rs links each with 2 MiB, so a batch of 100
    // needs no `memory.grow` (an `mprotect` in the instance pool, every
    // batch); the toolchain's default is about 1.1 MiB.
    for sink in ["webhook", "awareness", "couchdb-mark", "amqp"] {
        let path = built_plugins().join(format!("{sink}.wasm"));
        let bytes = std::fs::read(&path).unwrap();
        let mut largest = 0u64;
        for payload in wasmparser::Parser::new(0).parse_all(&bytes) {
            if let wasmparser::Payload::MemorySection(memories) = payload.unwrap() {
                for memory in memories {
                    largest = largest.max(memory.unwrap().initial);
                }
            }
        }
        assert_eq!(
            largest * 65_536,
            2 << 20,
            "{sink}: initial linear memory in bytes"
        );
    }
}
