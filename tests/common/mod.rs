//! Shared harness for the integration tests: builds the plugins and the test
//! components (tests/components/) from source, runs a real HTTP receiver on
//! loopback, and starts a daemon in the test process on its own temporary
//! SQLite database and plugins folder.
#![allow(dead_code)]

pub mod couchdb;
pub mod harness;
#[allow(unused_imports)] // used by the tests built on the harness
pub use harness::{Harness, Hook};
pub mod private_pg;
#[allow(unused_imports)] // used by the tests that stop their server
pub use private_pg::PrivatePostgres;
pub mod neo4j;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use base64::Engine as _;
use outboxd::config::Config;
use outboxd::daemon::{Daemon, Migrations};

/// Repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Build every shipped plugin (once per test process) and return the folder
/// holding `<name>.wasm` and `<name>.toml`.
pub fn built_plugins() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = repo_root();
            let status = std::process::Command::new("bash")
                .arg(root.join("scripts/build-plugins.sh"))
                .status()
                .expect("run scripts/build-plugins.sh");
            assert!(status.success(), "building the plugins failed");
            root.join("target/plugins")
        })
        .clone()
}

/// Build the sinks written in JavaScript (`plugins/js-*`, once per test
/// process, with npm and componentize-js) and return the folder holding
/// `<name>.wasm` and `<name>.toml`.
pub fn built_js_plugins() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = repo_root();
            let status = std::process::Command::new("bash")
                .arg(root.join("scripts/build-js-plugins.sh"))
                .status()
                .expect("run scripts/build-js-plugins.sh");
            assert!(status.success(), "building the JavaScript plugins failed");
            root.join("target/plugins-js")
        })
        .clone()
}

/// Build the sinks written in Python (`plugins/py-*`, once per test
/// process, with componentize-py) and return the folder holding
/// `<name>.wasm` and `<name>.toml`.
pub fn built_py_plugins() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = repo_root();
            let status = std::process::Command::new("bash")
                .arg(root.join("scripts/build-py-plugins.sh"))
                .status()
                .expect("run scripts/build-py-plugins.sh");
            assert!(status.success(), "building the Python plugins failed");
            root.join("target/plugins-py")
        })
        .clone()
}

/// Build the test components of `tests/components/` (once per test process)
/// and return the path of component `name` (`spin`, `membomb`, `panic`,
/// `stackoverflow`, `wrongcount`, `ok`).
///
/// Build outputs go to `target/wasm-test-components/` at the repository
/// root, never into the source folder.
pub fn test_component(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let root = repo_root();
        let target_dir = root.join("target/wasm-test-components");
        add_wasm_target();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args([
                "build",
                "--release",
                "--target",
                WASM_TARGET,
                "--manifest-path",
            ])
            .arg(root.join("tests/components/Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target_dir)
            .status()
            .expect("run cargo build for tests/components");
        assert!(
            status.success(),
            "building the test components (tests/components/) failed"
        );
        target_dir.join(WASM_TARGET).join("release")
    });
    let path = dir.join(format!("{}.wasm", name.replace('-', "_")));
    assert!(
        path.is_file(),
        "no test component {name:?}: {} is missing",
        path.display()
    );
    path
}

/// The target plugins and test components are built for.
const WASM_TARGET: &str = "wasm32-wasip2";

/// Install the wasm target with rustup when it is missing (as
/// scripts/build-plugins.sh does); without rustup, the build says why.
fn add_wasm_target() {
    let Ok(out) = std::process::Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
    else {
        return;
    };
    if !String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == WASM_TARGET)
    {
        let status = std::process::Command::new("rustup")
            .args(["target", "add", WASM_TARGET])
            .status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "rustup target add {WASM_TARGET} failed"
        );
    }
}

/// Send the daemon's logs to the test's captured output (shown only when a
/// test fails). The filter is `RUST_LOG`, else `outboxd=info`.
pub fn init_logs() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("outboxd=info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// The `secrets.key` of test daemons (in-process and children): one
/// fixed AES-256 key, so PostgreSQL may store destination secrets.
pub const TEST_SECRETS_KEY: &str = "test-key AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// A fresh Standard Webhooks secret.
pub fn new_secret() -> String {
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 24]>())
    )
}

/// One request seen by the receiver.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
    /// Path and query of the request (`/webhook`).
    pub path: String,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

/// A scripted answer: status, headers, body.
type ScriptedAnswer = (u16, Vec<(String, String)>, String);

#[derive(Default)]
struct ReceiverInner {
    seen: Vec<Received>,
    /// Scripted answers, used in order; when empty, 200.
    script: VecDeque<ScriptedAnswer>,
    /// How long each answer waits after the request is recorded (zero
    /// unless [`Receiver::set_delay`] is called).
    delay: Duration,
}

/// A real HTTP server on 127.0.0.1 that records every request.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    inner: Arc<Mutex<ReceiverInner>>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let inner = Arc::new(Mutex::new(ReceiverInner::default()));
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver { addr, inner }
    }

    /// Answer the next request with `status`, extra headers and body.
    pub fn script(&self, status: u16, headers: &[(&str, &str)], body: &str) {
        self.inner.lock().unwrap().script.push_back((
            status,
            headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body.to_string(),
        ));
    }

    /// Forget every scripted answer not used yet (later requests get 200).
    pub fn clear_script(&self) {
        self.inner.lock().unwrap().script.clear();
    }

    pub fn url(&self) -> String {
        format!("http://{}/webhook", self.addr)
    }

    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Received> {
        self.inner.lock().unwrap().seen.clone()
    }

    /// How many requests arrived so far.
    pub fn count(&self) -> usize {
        self.inner.lock().unwrap().seen.len()
    }

    /// Look at the requests seen so far (in arrival order) without copying
    /// them all.
    pub fn with_seen<R>(&self, f: impl FnOnce(&[Received]) -> R) -> R {
        f(&self.inner.lock().unwrap().seen)
    }

    /// Hold every answer for `delay` after recording the request, as a
    /// receiver doing some work would; the request counts as seen when it
    /// arrives, even if the sender goes away before the answer.
    pub fn set_delay(&self, delay: Duration) {
        self.inner.lock().unwrap().delay = delay;
    }
}

async fn handle(
    State(inner): State<Arc<Mutex<ReceiverInner>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let path = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string());
    let (status, extra, text, delay) = {
        let mut inner = inner.lock().unwrap();
        inner.seen.push(Received {
            headers,
            body,
            at: Instant::now(),
            path,
        });
        let (status, extra, text) =
            inner
                .script
                .pop_front()
                .unwrap_or((200, Vec::new(), String::new()));
        (status, extra, text, inner.delay)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut out = HeaderMap::new();
    for (k, v) in extra {
        out.insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    (StatusCode::from_u16(status).unwrap(), out, text)
}

/// Most seconds a `webhook-timestamp` may be from now: the Standard
/// Webhooks reference verifiers' tolerance (5 minutes).
const TIMESTAMP_TOLERANCE_SECS: u64 = 300;

/// Verify a Standard Webhooks signature; returns true when valid: it signs
/// `{webhook-id}.{webhook-timestamp}.{body}` and the timestamp is within
/// the specification's tolerance of now, as a receiver's verifier checks.
pub fn verify_signature(secret: &str, r: &Received) -> bool {
    use hmac::{Hmac, Mac};
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .unwrap();
    let (Some(id), Some(ts), Some(sigs)) = (
        r.header("webhook-id"),
        r.header("webhook-timestamp"),
        r.header("webhook-signature"),
    ) else {
        return false;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    match ts.parse::<u64>() {
        Ok(at) if at.abs_diff(now) <= TIMESTAMP_TOLERANCE_SECS => {}
        _ => return false,
    }
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&r.body);
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    sigs.split(' ')
        .any(|s| s.strip_prefix("v1,") == Some(expected.as_str()))
}

/// A plugins folder of a test's own, with the webhook component and a
/// manifest written for this test.
pub struct PluginsDir {
    pub dir: tempfile::TempDir,
}

impl PluginsDir {
    pub fn new() -> PluginsDir {
        PluginsDir {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Add a webhook sink named `name` posting to `url`, allowed to reach
    /// `allow` (origins), with retry base `retry_base`.
    pub fn add_webhook(&self, name: &str, url: &str, allow: &[String], secret: &str, extra: &str) {
        self.add_webhook_with_limits(
            name,
            url,
            allow,
            secret,
            "deadline = \"10s\"\nmax-batch = 50\n",
            extra,
        );
    }

    /// A webhook sink `name` posting to `receiver` (and allowed to reach it
    /// only), signing with a new secret, which it returns.
    pub fn add_webhook_to(&self, name: &str, receiver: &Receiver) -> String {
        let secret = new_secret();
        self.add_webhook(name, &receiver.url(), &[receiver.origin()], &secret, "");
        secret
    }

    /// [`PluginsDir::add_webhook`] with the body of the manifest's
    /// `[limits]` table given (e.g. `deadline = "2s"\nmax-batch = 20\n`).
    /// `extra` is appended after the `[config]` keys.
    pub fn add_webhook_with_limits(
        &self,
        name: &str,
        url: &str,
        allow: &[String],
        secret: &str,
        limits: &str,
        extra: &str,
    ) {
        let wasm = built_plugins().join("webhook.wasm");
        std::fs::copy(&wasm, self.path().join("webhook.wasm")).unwrap();
        let allow: Vec<String> = allow.iter().map(|a| format!("{a:?}")).collect();
        let manifest = format!(
            "name = {name:?}\nversion = \"0.1.0\"\ncomponent = \"webhook.wasm\"\nwit = \"outboxd:sink@0.1.0\"\n\
             [limits]\n{limits}\
             [capabilities]\nhttp = [{}]\n\
             [retry]\nbase = \"100ms\"\ncap = \"1s\"\n\
             [config]\nurl = {url:?}\nsecret = {secret:?}\n{extra}",
            allow.join(", ")
        );
        std::fs::write(self.path().join(format!("{name}.toml")), manifest).unwrap();
    }

    /// Add sink `name` running the component at `component` (copied in as
    /// `<name>.wasm`), with `extra` appended to its manifest (TOML tables
    /// such as `[limits]`, `[retry]`, `[config]`).
    pub fn add_component(&self, name: &str, component: &Path, extra: &str) {
        std::fs::copy(component, self.path().join(format!("{name}.wasm"))).unwrap();
        let manifest = format!(
            "name = {name:?}\nversion = \"0.1.0\"\ncomponent = \"{name}.wasm\"\nwit = \"outboxd:sink@0.1.0\"\n{extra}"
        );
        std::fs::write(self.path().join(format!("{name}.toml")), manifest).unwrap();
    }

    /// Write an arbitrary file into the folder.
    pub fn write(&self, file: &str, bytes: &[u8]) {
        std::fs::write(self.path().join(file), bytes).unwrap();
    }
}

/// A daemon running in this process on a temporary SQLite database.
pub struct TestDaemon {
    pub daemon: Option<Daemon>,
    pub base: String,
    pub data: tempfile::TempDir,
    pub http: reqwest::Client,
}

impl TestDaemon {
    pub async fn start(plugins: &Path) -> TestDaemon {
        Self::start_with(plugins, |_| {}).await
    }

    pub async fn start_with(plugins: &Path, adjust: impl FnOnce(&mut Config)) -> TestDaemon {
        let data = tempfile::tempdir().unwrap();
        let mut config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data.path().to_path_buf(),
            plugins_dir: plugins.to_path_buf(),
            ..Config::default()
        };
        config.delivery.max_poll_interval = Duration::from_millis(200);
        // Secrets at rest need a key on PostgreSQL; a test about keys
        // changes or removes it.
        config.secrets.key = Some(TEST_SECRETS_KEY.to_string());
        adjust(&mut config);
        let daemon = Daemon::start(config, Migrations::Apply)
            .await
            .expect("daemon starts");
        let base = format!("http://{}", daemon.addr);
        TestDaemon {
            daemon: Some(daemon),
            base,
            data,
            http: reqwest::Client::new(),
        }
    }

    pub async fn post(
        &self,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> (u16, serde_json::Value) {
        let r = self
            .http
            .post(format!("{}/v1/events", self.base))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Post one event in the CloudEvents JSON format; it must be accepted
    /// (201). Returns the answer's body.
    pub async fn post_event(&self, event: &serde_json::Value) -> serde_json::Value {
        let (status, body) = self
            .post(
                "application/cloudevents+json",
                serde_json::to_vec(event).unwrap(),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body
    }

    /// Post `events` as one CloudEvents JSON batch; it must be accepted
    /// (201). Returns the answer's body.
    pub async fn post_batch(&self, events: &[serde_json::Value]) -> serde_json::Value {
        let (status, body) = self
            .post(
                "application/cloudevents-batch+json",
                serde_json::to_vec(events).unwrap(),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// The deliveries of an event, as the read API reports them.
    pub async fn deliveries(&self, id: &str) -> Vec<serde_json::Value> {
        let (status, body) = self.get(&format!("/v1/events/{id}")).await;
        assert_eq!(status, 200, "GET /v1/events/{id}: {body}");
        body["deliveries"].as_array().cloned().unwrap_or_default()
    }

    /// Wait until `check` holds for the event's first delivery, or panic
    /// with the last state seen.
    pub async fn wait_delivery(
        &self,
        id: &str,
        timeout: Duration,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let d = self.deliveries(id).await;
            if let Some(first) = d.first() {
                if check(first) {
                    return first.clone();
                }
            }
            if start.elapsed() > timeout {
                panic!(
                    "delivery of {id} did not reach the expected state within {timeout:?}: {d:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The delivery of event `id` to `sink`, as the read API reports it.
    pub async fn delivery(&self, id: &str, sink: &str) -> Option<serde_json::Value> {
        self.deliveries(id)
            .await
            .into_iter()
            .find(|x| x["sink"] == sink)
    }

    /// Wait until `check` holds for the delivery of `id` to `sink`, or panic
    /// with the last state seen.
    pub async fn wait_sink(
        &self,
        id: &str,
        sink: &str,
        timeout: Duration,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let d = self.delivery(id, sink).await;
            if let Some(d) = &d {
                if check(d) {
                    return d.clone();
                }
            }
            if start.elapsed() > timeout {
                panic!("delivery of {id} to {sink} did not reach the expected state within {timeout:?}: {d:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn stop(mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown().await;
        }
    }
}

/// Byte equality in constant time, as a receiver compares secrets and
/// signatures.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Runs each named `async fn NAME(backend: Backend)` as two tests,
/// `sqlite::NAME` and `postgres::NAME` (`use common::*` brings `Backend`).
#[allow(unused_macros)] // used by the test files that run on both stores
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() { super::$name(super::Backend::Sqlite).await }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() { super::$name(super::Backend::Postgres).await }
            )*
        }
    };
}
#[allow(unused_imports)] // used by the test files that run on both stores
pub(crate) use both_stores;

/// A CloudEvent in the JSON format.
pub fn event(id: &str, stream: &str, ty: &str, data: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "specversion": "1.0",
        "id": id,
        "source": "https://example.com/tests",
        "type": ty,
        "partitionkey": stream,
        "datacontenttype": "application/json",
        "data": data,
    })
}

/// Wait until `f` returns true or `timeout` passes; returns the last value.
pub async fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f()
}

/// Admin URL of the test PostgreSQL server (`OUTBOXD_TEST_PG`, default
/// the local server with trust authentication).
pub fn pg_admin_url() -> String {
    std::env::var("OUTBOXD_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A database of the test's own: a fresh PostgreSQL database, or a fresh
/// SQLite file. Dropped (PostgreSQL) by [`TestDb::cleanup`].
pub struct TestDb {
    pub url: String,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}", dir.path().join("outboxd.db").display());
                TestDb {
                    url,
                    pg_name: None,
                    _dir: Some(dir),
                }
            }
            Backend::Postgres => {
                use sqlx::Connection;
                let name = format!("outboxd_test_{}", hex::encode(rand::random::<[u8; 6]>()));
                let mut admin = sqlx::PgConnection::connect(&pg_admin_url())
                    .await
                    .expect("PostgreSQL must run on 127.0.0.1:5432 (scripts/setup.sh starts it)");
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut admin)
                    .await
                    .unwrap();
                let admin_url = pg_admin_url();
                let base = admin_url.rsplit_once('/').unwrap().0;
                TestDb {
                    url: format!("{base}/{name}"),
                    pg_name: Some(name),
                    _dir: None,
                }
            }
        }
    }

    /// Open the store and apply its migrations.
    pub async fn store(&self) -> std::sync::Arc<dyn outboxd::store::Store> {
        let store = outboxd::store::open(&self.url).await.unwrap();
        store.migrate().await.unwrap();
        store
    }

    pub async fn cleanup(self) {
        use sqlx::Connection;
        if let Some(name) = &self.pg_name {
            if let Ok(mut admin) = sqlx::PgConnection::connect(&pg_admin_url()).await {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut admin)
                    .await;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// outboxd as a child process: the real binary, configured by OUTBOXD_*
// environment variables, killed and restarted by the test.

/// A loopback address whose port was free a moment ago, for a child daemon
/// to listen on across restarts. It is taken below the kernel's ephemeral
/// range (`net.ipv4.ip_local_port_range`), so no outgoing connection of
/// this machine can be holding it when the daemon comes back.
pub fn free_loopback_addr() -> SocketAddr {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|n| n.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    if ephemeral_low > 12000 {
        for _ in 0..200 {
            let port = rand::random_range(10000..ephemeral_low);
            if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                return listener.local_addr().unwrap();
            }
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().unwrap()
}

/// Where a child process writes its log: `target/test-logs/<name>.log` at
/// the repository root, emptied first. Kept after the test, for reading
/// when it fails.
pub fn child_log(name: &str) -> PathBuf {
    let dir = repo_root().join("target/test-logs");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.log"));
    std::fs::write(&path, b"").unwrap();
    path
}

/// How to run `outboxd run --migrate` as a child process.
#[derive(Debug, Clone)]
pub struct ChildConfig {
    /// `OUTBOXD_LISTEN`.
    pub listen: SocketAddr,
    /// `OUTBOXD_DATABASE_URL`.
    pub database_url: String,
    /// `OUTBOXD_PLUGINS_DIR`.
    pub plugins_dir: PathBuf,
    /// `OUTBOXD_DATA_DIR`.
    pub data_dir: PathBuf,
    /// More environment, e.g. `("OUTBOXD_DELIVERY__LEASE", "9s")`.
    pub env: Vec<(String, String)>,
    /// File the child's stdout and stderr are appended to.
    pub log: PathBuf,
}

/// A running `outboxd` child process. Dropping it kills the process.
pub struct ChildDaemon {
    child: Option<std::process::Child>,
    /// `http://<listen>`.
    pub base: String,
    /// The process id.
    pub pid: u32,
    log: PathBuf,
}

impl ChildDaemon {
    /// Start `outboxd run --migrate` (the binary this test crate was built
    /// with) under `config`. No `OUTBOXD_*` variable of the test's own
    /// environment reaches the child: only those of `config`.
    pub fn spawn(config: &ChildConfig) -> ChildDaemon {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&config.log)
            .unwrap_or_else(|e| panic!("open {}: {e}", config.log.display()));
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
        command.args(["run", "--migrate"]);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("OUTBOXD_") {
                command.env_remove(key);
            }
        }
        command
            .env("OUTBOXD_LISTEN", config.listen.to_string())
            .env("OUTBOXD_DATABASE_URL", &config.database_url)
            .env("OUTBOXD_PLUGINS_DIR", &config.plugins_dir)
            .env("OUTBOXD_DATA_DIR", &config.data_dir)
            .env("OUTBOXD_SECRETS__KEY", TEST_SECRETS_KEY)
            .env("NO_COLOR", "1")
            .envs(config.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = command.spawn().expect("spawn the outboxd binary");
        let base = format!("http://{}", config.listen);
        ChildDaemon {
            pid: child.id(),
            child: Some(child),
            base,
            log: config.log.clone(),
        }
    }

    /// Wait until `GET /health` answers 200; returns how long that took.
    /// Panics, with the end of the child's log, when the process exits
    /// first or `timeout` passes.
    pub async fn wait_healthy(&mut self, timeout: Duration) -> Duration {
        let start = Instant::now();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!(
                    "outboxd (pid {}) exited with {status} before it was healthy:\n{}",
                    self.pid,
                    self.log_tail(40)
                );
            }
            if let Ok(r) = http.get(format!("{}/health", self.base)).send().await {
                if r.status().is_success() {
                    return start.elapsed();
                }
            }
            if start.elapsed() > timeout {
                panic!(
                    "outboxd (pid {}) not healthy within {timeout:?}:\n{}",
                    self.pid,
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// One `GET /health`: true when it answers 200.
    pub async fn is_healthy(&self) -> bool {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        matches!(http.get(format!("{}/health", self.base)).send().await, Ok(r) if r.status().is_success())
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// SIGKILL, then reap the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait up to `timeout` for the exit; SIGKILL after that.
    /// Returns the exit status when the process exited by itself.
    pub async fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// The last `lines` lines of the child's log file (shared by every life
    /// of a restarted daemon).
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }
}

impl Drop for ChildDaemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a log file.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    format!(
        "--- {} (last {} lines) ---\n{}",
        path.display(),
        all.len() - from,
        all[from..].join("\n")
    )
}

/// Another session holding locks in an open transaction — the rows a
/// `SELECT … FOR UPDATE` names, or a table `LOCK TABLE` names — until
/// [`HeldLocks::release`] rolls it back (as an application's transaction
/// left open, or an ingest of the stream).
pub struct HeldLocks(sqlx::PgConnection);

impl HeldLocks {
    /// Connect to `url`, begin, and run `statement`, which takes the locks.
    pub async fn take(url: &str, statement: &str) -> HeldLocks {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::raw_sql("BEGIN").execute(&mut c).await.unwrap();
        sqlx::raw_sql(statement).execute(&mut c).await.unwrap();
        HeldLocks(c)
    }

    /// Roll the transaction back, freeing its locks.
    pub async fn release(mut self) {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut self.0)
            .await
            .unwrap();
    }
}

/// A private certificate authority and, signed by it, a certificate for
/// 127.0.0.1: (CA PEM, leaf PEM, leaf key PEM). No public root signs it,
/// as with a receiver inside a company network.
pub fn private_ca() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "outboxd test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    (ca.pem(), leaf.pem(), leaf_key.serialize_pem())
}

/// An HTTPS receiver on loopback serving `cert`/`key` (written into
/// `dir`), offering HTTP/2 and HTTP/1.1 by ALPN: its address, and the HTTP
/// version and body of every request, each answered 200.
pub async fn https_receiver(
    dir: &std::path::Path,
    (cert, key): (&str, &str),
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<(axum::http::Version, bytes::Bytes)>>>,
) {
    std::fs::write(dir.join("cert.pem"), cert).unwrap();
    std::fs::write(dir.join("key.pem"), key).unwrap();
    let tls = outboxd::tls::server_config(&outboxd::tls::TlsConfig {
        cert_file: dir.join("cert.pem"),
        key_file: dir.join("key.pem"),
        reload_interval: Duration::from_secs(10),
    })
    .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = seen.clone();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let recorded = recorded.clone();
        async move {
            let version = request.version();
            let body = axum::body::to_bytes(request.into_body(), 1 << 20)
                .await
                .unwrap_or_default();
            recorded.lock().unwrap().push((version, body));
            "ok"
        }
    });
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let config = axum_server::tls_rustls::RustlsConfig::from_config(tls);
    let server = axum_server::from_tcp_rustls(listener, config).unwrap();
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    (addr, seen)
}
