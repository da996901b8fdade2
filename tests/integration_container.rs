//! What the container image and the compose file rely on, with the real
//! binary: the image's configuration (deploy/image/outboxd.toml) refuses to
//! listen beyond loopback without an admin token and, with one, serves
//! `/health` to `outboxd health` while the admin API, `/metrics` and ingest
//! ask for tokens; the Containerfile agrees with that configuration; and
//! the outboxd service of deploy/compose/compose.yaml — its environment and
//! its mounted configuration — is accepted by the daemon and runs on
//! PostgreSQL.
//!
//! The image itself is built and smoke-tested by scripts/image.sh (it needs
//! buildah and a release build, so it is not part of the test command).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Where the image installs the plugins (deploy/image/outboxd.toml).
const IMAGE_PLUGINS_DIR: &str = "/usr/lib/outboxd/plugins";
/// Where the image keeps its data, the VOLUME.
const IMAGE_DATA_DIR: &str = "/var/lib/outboxd";

/// `outboxd` with exactly `env` of the `OUTBOXD_*` variables.
fn outboxd(env: &BTreeMap<String, String>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outboxd"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OUTBOXD_") {
            command.env_remove(key);
        }
    }
    command.envs(env).env("NO_COLOR", "1").stdin(Stdio::null());
    command
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A plugins folder as the image has it: the shipped webhook sink with its
/// manifest (the others ship disabled).
fn image_plugins() -> tempfile::TempDir {
    let built = built_plugins();
    let dir = tempfile::tempdir().unwrap();
    for file in ["webhook.wasm", "webhook.toml"] {
        std::fs::copy(built.join(file), dir.path().join(file)).unwrap();
    }
    dir
}

/// A daemon child killed on drop.
struct Running(Child, PathBuf);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    fn spawn(mut command: Command, name: &str) -> Running {
        let log = child_log(name);
        let file = std::fs::File::create(&log).unwrap();
        command.stdout(file.try_clone().unwrap()).stderr(file);
        Running(command.spawn().expect("spawn outboxd"), log)
    }

    /// Wait until `GET url` answers 200.
    async fn wait_for(&mut self, url: &str) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                panic!(
                    "outboxd exited with {status}:\n{}",
                    std::fs::read_to_string(&self.1).unwrap_or_default()
                );
            }
            if let Ok(r) = reqwest::get(url).await {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no 200 from {url}:\n{}",
                std::fs::read_to_string(&self.1).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The instructions of the Containerfile, `(INSTRUCTION, rest)`, with
/// continuation lines joined.
fn containerfile() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_root().join("deploy/image/Containerfile")).unwrap();
    let mut joined = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        if let Some(cont) = line.strip_suffix('\\') {
            joined.push_str(cont);
            joined.push(' ');
        } else {
            joined.push_str(line);
            joined.push('\n');
        }
    }
    joined
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (word, rest) = l.split_once(' ').unwrap_or((l, ""));
            (word.to_string(), rest.trim().to_string())
        })
        .collect()
}

fn instruction(all: &[(String, String)], word: &str) -> String {
    all.iter()
        .find(|(w, _)| w == word)
        .unwrap_or_else(|| panic!("the Containerfile has no {word}"))
        .1
        .clone()
}

#[test]
fn the_containerfile_agrees_with_the_image_configuration() {
    let file = containerfile();
    let config: toml::Value = toml::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/image/outboxd.toml")).unwrap(),
    )
    .unwrap();
    assert_eq!(instruction(&file, "FROM"), "scratch");
    assert_eq!(config["data-dir"].as_str(), Some(IMAGE_DATA_DIR));
    assert_eq!(config["plugins-dir"].as_str(), Some(IMAGE_PLUGINS_DIR));
    assert_eq!(
        instruction(&file, "VOLUME"),
        format!("[\"{IMAGE_DATA_DIR}\"]")
    );
    let user = instruction(&file, "USER");
    assert!(
        !user.starts_with("0") && !user.starts_with("root"),
        "USER {user}"
    );
    assert!(
        instruction(&file, "ENV").contains("OUTBOXD_CONFIG=/etc/outboxd/outboxd.toml"),
        "the image names its configuration"
    );
    assert!(
        !instruction(&file, "ENV").contains("TOKEN"),
        "no token is baked into the image"
    );
    let cmd: Vec<String> = serde_json::from_str(&instruction(&file, "CMD")).unwrap();
    let listen = cmd[cmd.iter().position(|a| a == "--listen").unwrap() + 1].clone();
    let port = listen.rsplit_once(':').unwrap().1;
    assert_eq!(instruction(&file, "EXPOSE"), port);
    assert!(instruction(&file, "HEALTHCHECK").contains("\"/usr/bin/outboxd\", \"health\""));
    assert_eq!(instruction(&file, "ENTRYPOINT"), "[\"/usr/bin/outboxd\"]");
}

/// The image's environment: its configuration file, the rest left to the
/// defaults; the folders it points at replaced by the test's own.
fn image_env(data: &Path, plugins: &Path) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "OUTBOXD_CONFIG".into(),
            repo_root()
                .join("deploy/image/outboxd.toml")
                .display()
                .to_string(),
        ),
        ("OUTBOXD_DATA_DIR".into(), data.display().to_string()),
        ("OUTBOXD_PLUGINS_DIR".into(), plugins.display().to_string()),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_image_default_needs_an_admin_token_and_then_guards_every_door() {
    let data = tempfile::tempdir().unwrap();
    let plugins = image_plugins();
    let port = free_loopback_addr().port();
    let listen = format!("0.0.0.0:{port}");
    let mut env = image_env(data.path(), plugins.path());

    // The image's CMD without OUTBOXD_ADMIN__TOKEN: refused, naming it.
    let refused = outboxd(&env)
        .args(["run", "--migrate", "--listen", &listen])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("admin.token") && text(&refused).contains("OUTBOXD_ADMIN__TOKEN"),
        "{}",
        text(&refused)
    );

    // Nothing answers yet: `outboxd health` says so and exits 1.
    let mut probe_env = env.clone();
    probe_env.insert("OUTBOXD_LISTEN".into(), format!("127.0.0.1:{port}"));
    let nobody = outboxd(&probe_env).arg("health").output().unwrap();
    assert_eq!(nobody.status.code(), Some(1), "{}", text(&nobody));
    assert!(
        text(&nobody).contains("no daemon answered"),
        "{}",
        text(&nobody)
    );

    let token = "container-test-admin-token";
    env.insert("OUTBOXD_ADMIN__TOKEN".into(), token.into());
    env.insert("OUTBOXD_WEBHOOK_SECRET".into(), new_secret());
    let mut command = outboxd(&env);
    command.args(["run", "--migrate", "--listen", &listen]);
    let mut daemon = Running::spawn(command, "container-image-default");
    let base = format!("http://127.0.0.1:{port}");
    daemon.wait_for(&format!("{base}/health")).await;

    // The health check as the image runs it: the loopback default of
    // `listen`, the image's configuration, no token.
    let mut check_env = image_env(data.path(), plugins.path());
    check_env.insert("OUTBOXD_LISTEN".into(), format!("127.0.0.1:{port}"));
    let healthy = outboxd(&check_env).arg("health").output().unwrap();
    assert!(healthy.status.success(), "{}", text(&healthy));
    assert!(
        text(&healthy).contains("\"status\":\"ok\""),
        "{}",
        text(&healthy)
    );

    let http = reqwest::Client::new();
    let ready = http.get(format!("{base}/ready")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let ready: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(
        ready["checks"]["plugins"]["loaded"],
        serde_json::json!(["webhook"])
    );
    for (what, request) in [
        ("admin API", http.get(format!("{base}/v1/admin/sinks"))),
        ("metrics", http.get(format!("{base}/metrics"))),
        (
            "ingest",
            http.post(format!("{base}/v1/events"))
                .header("content-type", "application/cloudevents+json")
                .body(r#"{"specversion":"1.0","id":"a","source":"/t","type":"t"}"#),
        ),
    ] {
        let status = request.send().await.unwrap().status();
        assert_eq!(status, 401, "{what} without a token");
    }
    let with_token = http
        .get(format!("{base}/v1/admin/sinks"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(with_token.status(), 200);
    // The CLI inside the container reaches the daemon with the same
    // environment (`exec outboxd producers create …`).
    let mut cli_env = check_env.clone();
    cli_env.insert("OUTBOXD_ADMIN__TOKEN".into(), token.into());
    let created = outboxd(&cli_env)
        .args(["producers", "create", "billing"])
        .output()
        .unwrap();
    assert!(created.status.success(), "{}", text(&created));
    assert!(text(&created).contains("obx_"), "{}", text(&created));
}

/// `${VAR}`, `${VAR:-default}` and `${VAR:?message}` in `value`, from
/// `vars` (the compose file's interpolation); a `:?` variable missing is
/// an error naming it.
fn interpolate(value: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let end = rest[at..].find('}').expect("closed ${") + at;
        let inner = &rest[at + 2..end];
        let (name, fallback) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d.to_string())),
            None => (inner.split_once(":?").map_or(inner, |(n, _)| n), None),
        };
        match (vars.get(name), fallback) {
            (Some(v), _) => out.push_str(v),
            (None, Some(d)) => out.push_str(&d),
            (None, None) => panic!("compose.yaml needs {name}, which the test does not give"),
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_compose_files_outboxd_config_is_accepted_and_runs_on_postgres() {
    let compose: serde_json::Value = serde_norway::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/compose/compose.yaml")).unwrap(),
    )
    .expect("compose.yaml is YAML");
    let service = &compose["services"]["outboxd"];
    assert!(service["depends_on"]["postgres"].is_object());
    // What .env would hold (docs/guides/container.md says how to make
    // each); the URL's password is checked to be the database's.
    let vars: BTreeMap<&str, String> = BTreeMap::from([
        ("POSTGRES_PASSWORD", "0123abcd".to_string()),
        ("OUTBOXD_ADMIN_TOKEN", "compose-admin-token".to_string()),
        (
            "OUTBOXD_SECRETS_KEY",
            "k1 AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=".to_string(),
        ),
        ("OUTBOXD_WEBHOOK_SECRET", new_secret()),
    ]);
    let mut env: BTreeMap<String, String> = service["environment"]
        .as_object()
        .expect("environment as a map")
        .iter()
        .map(|(k, v)| (k.clone(), interpolate(v.as_str().unwrap(), &vars)))
        .collect();
    let postgres_env = &compose["services"]["postgres"]["environment"];
    let url = env["OUTBOXD_DATABASE_URL"].clone();
    assert_eq!(
        url,
        format!(
            "postgres://{}:{}@postgres:5432/{}",
            postgres_env["POSTGRES_USER"].as_str().unwrap(),
            vars["POSTGRES_PASSWORD"],
            postgres_env["POSTGRES_DB"].as_str().unwrap()
        )
    );
    // The configuration file compose mounts at OUTBOXD_CONFIG.
    let mount = service["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .find(|v| v.ends_with(&format!("{}:ro", env["OUTBOXD_CONFIG"])))
        .expect("a volume mounts the file OUTBOXD_CONFIG names");
    let file = repo_root()
        .join("deploy/compose")
        .join(mount.split(':').next().unwrap());
    env.insert("OUTBOXD_CONFIG".into(), file.display().to_string());

    // As the image's CMD has it (beyond loopback), the configuration is
    // accepted as written: `config show` loads and validates it.
    let shown = outboxd(&env)
        .args(["config", "show", "--listen", "0.0.0.0:8080"])
        .output()
        .unwrap();
    assert!(shown.status.success(), "{}", text(&shown));
    let shown = text(&shown);
    assert!(shown.contains("auth = \"required\""), "{shown}");
    assert!(
        !shown.contains("compose-admin-token"),
        "a secret shown: {shown}"
    );
    assert!(
        !shown.contains("0123abcd"),
        "the database password shown: {shown}"
    );

    // And it runs: on a PostgreSQL database of the test's own (the compose
    // network's `postgres` host is this machine's server here), with the
    // plugins and data in folders of the test's own.
    let db = TestDb::new(Backend::Postgres).await;
    let data = tempfile::tempdir().unwrap();
    let plugins = image_plugins();
    env.insert("OUTBOXD_DATABASE_URL".into(), db.url.clone());
    env.insert("OUTBOXD_DATA_DIR".into(), data.path().display().to_string());
    env.insert(
        "OUTBOXD_PLUGINS_DIR".into(),
        plugins.path().display().to_string(),
    );
    let port = free_loopback_addr().port();
    let mut command = outboxd(&env);
    command.args(["run", "--migrate", "--listen", &format!("0.0.0.0:{port}")]);
    let mut daemon = Running::spawn(command, "container-compose");
    let base = format!("http://127.0.0.1:{port}");
    daemon.wait_for(&format!("{base}/ready")).await;
    let http = reqwest::Client::new();
    let made: serde_json::Value = http
        .post(format!("{base}/v1/admin/producers"))
        .bearer_auth("compose-admin-token")
        .json(&serde_json::json!({"name": "billing"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = made["token"]
        .as_str()
        .expect("a producer token")
        .to_string();
    let posted = http
        .post(format!("{base}/v1/events"))
        .bearer_auth(&token)
        .header("content-type", "application/cloudevents+json")
        .body(r#"{"specversion":"1.0","id":"compose-1","source":"/billing","type":"invoice.paid"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 201);
    drop(daemon);
    db.cleanup().await;
}
