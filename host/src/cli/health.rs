//! `outboxd health`: the running daemon's `/health`, asked from the same
//! host — the probe a container's `HEALTHCHECK` runs (the image has no
//! shell and no HTTP client besides `outboxd` itself).
//!
//! Owns: one `GET /health` of the daemon at `listen` (loopback when it
//! listens on every address, over TLS when it serves TLS, through
//! [`super::client`]), printing its answer and turning it into the exit
//! code: 0 for `200`, 1 for anything else or no answer.
//!
//! Must never: retry, wait past [`outboxd::limits::CLIENT_TIMEOUT`], or
//! look at the database: the probe is the daemon's own.

use std::process::ExitCode;

use outboxd::config::Config;

use super::client::{self, DaemonAt};

/// Ask the daemon `config` describes for `/health`; print its JSON answer
/// (or why there is none) and exit 0 only when it answered `200`.
pub async fn run(config: &Config) -> ExitCode {
    let daemon = DaemonAt::of(config);
    match client::request::<serde_json::Value>(
        &daemon,
        http::Method::GET,
        "/health",
        None,
        outboxd::limits::CLIENT_TIMEOUT,
    )
    .await
    {
        Ok(Ok(answer)) => {
            println!("{answer}");
            ExitCode::SUCCESS
        }
        Ok(Err(refused)) => {
            // `/health` answers 503 with the stale loops, not an
            // `error`: the status is what a probe acts on.
            eprintln!("outboxd: /health answered HTTP {}", refused.status);
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("outboxd: {e}");
            ExitCode::FAILURE
        }
    }
}
