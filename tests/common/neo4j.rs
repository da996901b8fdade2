//! A real Neo4j 5.26 for the tests: the embedded server of `tests/neo4j/`
//! (a small Maven project), built once with Maven and started with plain
//! `java` and Neo4j's own JVM flags on a free loopback port, one per test
//! process. Tests share it and keep apart by using a label of their own.
//!
//! The server runs until its standard input closes, which happens when the
//! test process exits (even by SIGKILL), so no Neo4j outlives its tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Longest wait for the embedded server's ready line.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// The JVM flags Neo4j's own launcher passes (its `server.jvm.additional`)
/// that an embedded Neo4j 5.26 on Java 17 needs, plus a heap cap.
pub const JVM_FLAGS: &[&str] = &[
    "-Xmx768m",
    "-XX:+UseG1GC",
    "-XX:-OmitStackTraceInFastThrow",
    "-Djdk.nio.maxCachedBufferSize=1024",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--enable-native-access=ALL-UNNAMED",
    "-Dlog4j2.disable.jmx=true",
];

/// The running embedded Neo4j of this test process.
pub struct Neo4jServer {
    /// `bolt://127.0.0.1:PORT`.
    pub uri: String,
    pub port: u16,
    child: Mutex<Child>,
    /// Held open: the server exits when it closes. Also carries
    /// `EXPLAIN` requests ([`Neo4jServer::explain`]).
    stdin: Mutex<ChildStdin>,
    /// The server's stdout lines after its ready line.
    lines: Mutex<std::sync::mpsc::Receiver<String>>,
    _home: tempfile::TempDir,
    pub log: PathBuf,
}

impl Neo4jServer {
    /// The server of this test process, started on first use.
    pub fn shared() -> &'static Neo4jServer {
        static SERVER: OnceLock<Neo4jServer> = OnceLock::new();
        SERVER.get_or_init(Neo4jServer::start)
    }

    /// Build the Maven project when its jars are missing, then start a
    /// server on a free port and wait for its ready line.
    pub fn start() -> Neo4jServer {
        let out = build_embedded();
        let home = tempfile::tempdir().unwrap();
        let log = super::child_log(&format!("neo4j-{}", std::process::id()));
        let mut last = String::new();
        for _ in 0..3 {
            let port = super::free_loopback_addr().port();
            let classpath = format!(
                "{}:{}/*",
                out.join("classes").display(),
                out.join("lib").display()
            );
            let mut child = Command::new("java")
                .args(JVM_FLAGS)
                .args(["-cp", &classpath, "outboxd.testing.EmbeddedNeo4j"])
                .arg(home.path().join(format!("db-{port}")))
                .arg(port.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("run `java` (Java 17 must be installed: scripts/setup.sh)");
            let stdin = child.stdin.take().unwrap();
            let stdout = child.stdout.take().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let _ = tx.send(line);
                }
            });
            let start = Instant::now();
            let ready = loop {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(line) if line.starts_with("NEO4J READY") => break true,
                    Ok(_) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break false,
                    Err(_) if start.elapsed() > START_TIMEOUT => break false,
                    Err(_) => {}
                }
            };
            if ready {
                return Neo4jServer {
                    uri: format!("bolt://127.0.0.1:{port}"),
                    port,
                    child: Mutex::new(child),
                    stdin: Mutex::new(stdin),
                    lines: Mutex::new(rx),
                    _home: home,
                    log,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
            last = super::log_tail(&log, 40);
        }
        panic!("the embedded Neo4j did not start (tried 3 ports):\n{last}");
    }

    /// A driver connected to this server (no authentication).
    pub fn graph(&self) -> neo4rs::Graph {
        let config = neo4rs::ConfigBuilder::default()
            .uri(&self.uri)
            .user("neo4j")
            .password("")
            .max_connections(16)
            .build()
            .unwrap();
        neo4rs::Graph::connect(config).unwrap()
    }

    /// The operators of `query`'s plan (`EXPLAIN`, depth first), e.g.
    /// `["ProduceResults", "Limit", "NodeIndexSeekByRange"]`, as the server
    /// itself reports them. Panics when the query does not plan.
    pub fn explain(&self, query: &str) -> Vec<String> {
        use base64::Engine as _;
        use std::io::Write;
        let lines = self.lines.lock().unwrap();
        {
            let mut stdin = self.stdin.lock().unwrap();
            writeln!(
                stdin,
                "EXPLAIN {}",
                base64::engine::general_purpose::STANDARD.encode(query)
            )
            .unwrap();
            stdin.flush().unwrap();
        }
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(30))
                .expect("the embedded Neo4j answers EXPLAIN");
            if let Some(plan) = line.strip_prefix("PLAN ") {
                return plan.split(';').map(str::to_string).collect();
            }
            if let Some(e) = line.strip_prefix("PLAN-ERROR ") {
                panic!("EXPLAIN failed: {e}\nquery: {query}");
            }
        }
    }

    /// True while the server process runs.
    pub fn is_running(&self) -> bool {
        self.child.lock().unwrap().try_wait().unwrap().is_none()
    }
}

/// Build `tests/neo4j/` with Maven when `target/neo4j-embedded/` lacks
/// its classes or jars (or the pom changed since); returns that folder.
/// The first build fetches Neo4j's jars from Maven Central into the local
/// Maven cache (~/.m2); later ones are offline-fast.
pub fn build_embedded() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = super::repo_root();
            let project = root.join("tests/neo4j");
            let out = root.join("target/neo4j-embedded");
            let stamp = out.join("lib/.built");
            let fresh = |src: &std::path::Path| {
                let (Ok(a), Ok(b)) = (std::fs::metadata(src), std::fs::metadata(&stamp)) else {
                    return false;
                };
                a.modified().unwrap() <= b.modified().unwrap()
            };
            let main = project.join("src/main/java/outboxd/testing/EmbeddedNeo4j.java");
            if !(fresh(&project.join("pom.xml")) && fresh(&main)) {
                let status = Command::new("mvn")
                    .args(["-q", "-B", "package", "-DskipTests", "-f"])
                    .arg(project.join("pom.xml"))
                    .status()
                    .expect("run `mvn` (Maven must be installed: scripts/setup.sh)");
                assert!(status.success(), "building tests/neo4j with Maven failed");
                std::fs::write(&stamp, b"").unwrap();
            }
            out
        })
        .clone()
}

/// A label no other test uses, e.g. `Outbox_3fa2c1d0e9b8`.
pub fn unique_label() -> String {
    format!("Outbox_{}", hex::encode(rand::random::<[u8; 6]>()))
}
