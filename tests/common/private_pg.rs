//! A PostgreSQL server of a test's own, for the tests that stop and start
//! it (readiness, a source's behaviour during an outage).

use super::free_loopback_addr;

/// A PostgreSQL server of this test's own (initdb into a temporary folder,
/// trust auth, loopback only), so the test can stop and start it.
pub struct PrivatePostgres {
    dir: tempfile::TempDir,
    port: u16,
}

impl PrivatePostgres {
    fn bin(tool: &str) -> std::path::PathBuf {
        let versions = std::fs::read_dir("/usr/lib/postgresql").expect(
            "PostgreSQL server binaries under /usr/lib/postgresql (scripts/setup.sh installs them)",
        );
        let mut dirs: Vec<_> = versions.filter_map(|e| e.ok().map(|e| e.path())).collect();
        dirs.sort();
        dirs.last()
            .expect("a PostgreSQL version")
            .join("bin")
            .join(tool)
    }

    /// A server tool's command; as root, run as the `postgres` user (the
    /// server refuses to run as root).
    fn command(tool: &str) -> std::process::Command {
        let as_root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout == b"0\n")
            .unwrap_or(false);
        let bin = Self::bin(tool);
        if as_root {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&bin);
            c
        } else {
            std::process::Command::new(&bin)
        }
    }

    /// Run a server tool; it must succeed.
    fn run(tool: &str, args: &[&str]) {
        let out = Self::command(tool)
            .args(args)
            .output()
            .expect("run a PostgreSQL tool");
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn init() -> PrivatePostgres {
        let dir = tempfile::Builder::new()
            .prefix("outboxd-pg-")
            .tempdir()
            .unwrap();
        let _ = std::process::Command::new("chown")
            .args(["postgres:postgres"])
            .arg(dir.path())
            .status();
        let data = dir.path().join("data");
        Self::run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        let port = free_loopback_addr().port();
        let pg = PrivatePostgres { dir, port };
        pg.start();
        pg
    }

    pub fn start(&self) {
        let data = self.dir.path().join("data");
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        Self::run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-o",
                &options,
                "-w",
                "-l",
                self.dir.path().join("log").to_str().unwrap(),
                "start",
            ],
        );
    }

    pub fn stop(&self) {
        let data = self.dir.path().join("data");
        Self::run(
            "pg_ctl",
            &["-D", data.to_str().unwrap(), "-m", "fast", "-w", "stop"],
        );
    }

    /// `pg_ctl restart -m fast`: every connection is closed, in-flight
    /// transactions roll back, and the server is back when this returns.
    pub fn restart(&self) {
        self.stop();
        self.start();
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = Self::command("pg_ctl")
            .args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"])
            .output();
    }
}
