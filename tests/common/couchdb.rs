//! A CouchDB-protocol server for the tests: `pouchdb-server` from npm,
//! pinned by `tests/couchdb/package-lock.json`, started on a free loopback
//! port with a data folder of its own and killed when dropped.
//!
//! Production runs Apache CouchDB 3.x; pouchdb-server implements the same
//! HTTP API (documents with revisions and 409 conflicts, design documents
//! with map views, `_changes`). The helpers here speak only that API.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Longest the server may take to answer `GET /` after it is spawned.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The folder holding the pinned `package.json` and `package-lock.json`.
fn package_dir() -> PathBuf {
    super::repo_root().join("tests/couchdb")
}

/// `pouchdb-server`'s entry script, installed with `npm ci` (once per test
/// process) when it is missing. scripts/setup.sh runs the same `npm ci`.
fn server_script() -> PathBuf {
    static INSTALLED: OnceLock<PathBuf> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let dir = package_dir();
            let script = dir.join("node_modules/pouchdb-server/bin/pouchdb-server");
            if !script.is_file() {
                let status = Command::new("npm")
                    .args(["ci", "--no-audit", "--no-fund"])
                    .current_dir(&dir)
                    .status()
                    .expect("run npm ci in tests/couchdb (Node 20 and npm are needed)");
                assert!(status.success(), "npm ci in tests/couchdb failed");
            }
            assert!(
                script.is_file(),
                "{} missing after npm ci",
                script.display()
            );
            script
        })
        .clone()
}

/// A running pouchdb-server. Dropping it kills the process.
pub struct CouchServer {
    child: Option<Child>,
    /// `http://127.0.0.1:<port>` (no trailing slash).
    pub url: String,
    pub http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl CouchServer {
    /// Start a server on a free port with an empty data folder; returns once
    /// it answers.
    pub async fn start() -> CouchServer {
        let script = server_script();
        let dir = tempfile::tempdir().unwrap();
        let port = super::free_loopback_addr().port();
        let log = super::child_log(&format!("pouchdb-server-{port}"));
        let out = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        let child = Command::new("node")
            .arg(&script)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--dir")
            .arg(dir.path())
            .arg("--config")
            .arg(dir.path().join("config.json"))
            .arg("--no-stdout-logs")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn node pouchdb-server");
        let server = CouchServer {
            child: Some(child),
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            _dir: dir,
        };
        let started = Instant::now();
        loop {
            if let Ok(r) = server.http.get(&server.url).send().await {
                if r.status().is_success() {
                    break;
                }
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "pouchdb-server did not answer on {} within {START_TIMEOUT:?}; log: {}",
                server.url,
                log.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
    }

    /// `PUT /{db}`: create a database (must not exist).
    pub async fn create_db(&self, db: &str) {
        let r = self
            .http
            .put(format!("{}/{db}", self.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "PUT /{db}: {:?}", r.text().await);
    }

    /// `PUT /_config/admins/{user}`: end the admin party, as a production
    /// CouchDB runs. Afterwards design documents and new databases need
    /// this user's basic auth (a wrong password is refused with 401);
    /// documents of existing databases stay writable without it, as in
    /// CouchDB for a database with no `_security` members.
    pub async fn add_admin(&self, user: &str, password: &str) {
        let r = self
            .http
            .put(format!("{}/_config/admins/{}", self.url, encode(user)))
            .json(&password)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "add admin: {:?}", r.text().await);
    }

    /// `PUT /{db}/{id}` with `doc` as it is (give `_rev` to update).
    /// Returns the status and the answer.
    pub async fn put(&self, db: &str, id: &str, doc: &Value) -> (u16, Value) {
        let r = self
            .http
            .put(format!("{}/{db}/{}", self.url, encode(id)))
            .json(doc)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// `PUT` that must succeed (201); returns the new `_rev`.
    pub async fn save(&self, db: &str, id: &str, doc: &Value) -> String {
        let (status, body) = self.put(db, id, doc).await;
        assert!(
            status == 201 || status == 202,
            "PUT {db}/{id}: {status} {body}"
        );
        body["rev"].as_str().unwrap().to_string()
    }

    /// `GET /{db}/{id}`; `None` on 404.
    pub async fn get(&self, db: &str, id: &str) -> Option<Value> {
        let r = self
            .http
            .get(format!("{}/{db}/{}", self.url, encode(id)))
            .send()
            .await
            .unwrap();
        if r.status().as_u16() == 404 {
            return None;
        }
        assert!(r.status().is_success(), "GET {db}/{id}: {}", r.status());
        Some(r.json().await.unwrap())
    }

    /// `GET` a path under the server (e.g. a view), as JSON.
    pub async fn get_path(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}/{path}", self.url))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// `DELETE /{db}/{id}?rev=`.
    pub async fn delete(&self, db: &str, id: &str, rev: &str) {
        let r = self
            .http
            .delete(format!("{}/{db}/{}", self.url, encode(id)))
            .query(&[("rev", rev)])
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "DELETE {db}/{id}: {}", r.status());
    }

    /// Kill the server now.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for CouchServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A document id as one path segment (`/` and the like percent-encoded).
pub fn encode(id: &str) -> String {
    let mut out = String::new();
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One outbox entry in the default shape (`extensions._server_outbox[]`).
pub fn entry(event_id: &str, doc_id: &str, sequence: u64, operation: &str, ty: &str) -> Value {
    json!({
        "event_id": event_id,
        "mutation_id": format!("m-{event_id}"),
        "content_hash": format!("h-{event_id}"),
        "document_id": doc_id,
        "sequence": sequence,
        "operation": operation,
        "routing_key": format!("documents.{operation}.{ty}"),
        "status": "pending",
        "created_at": "2026-12-01T10:00:00.000Z",
        "published_at": null,
        "payload": { "document_id": doc_id, "sequence": sequence, "operation": operation },
    })
}

/// A document holding `entries` in its outbox (and their mutation ids).
pub fn document(ty: &str, body: Value, entries: &[Value]) -> Value {
    let mutations: serde_json::Map<String, Value> = entries
        .iter()
        .map(|e| {
            (
                e["mutation_id"].as_str().unwrap_or("").to_string(),
                e["content_hash"].clone(),
            )
        })
        .collect();
    json!({
        "type": ty,
        "body": body,
        "extensions": {
            "_server_outbox": entries,
            "_server_mutations": mutations,
        }
    })
}
