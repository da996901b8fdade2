//! The admin command line: `outboxd events|attempts|dead|sinks|sources|backfill|
//! destinations|producers|secrets|config …`, one file per group, each a
//! face of the admin actions (`outboxd::ops::actions`) that turns
//! arguments into an action's input and prints its answer.
//!
//! The rule: **a command goes through the running daemon** — its admin
//! API at `listen`, with `admin.token`, over TLS when it serves TLS
//! ([`client`]) — so it answers exactly as the API does and acts with
//! what lives in the daemon (loaded plugins, routes, the producer gate,
//! the keyring, source status) and wakes its delivery loops. It opens the
//! database only when given **`--offline`**, which only the commands whose
//! work is the database's alone take: `events show`, `attempts list`, `dead
//! list|replay|purge`, `sinks list|pause|resume|retire` (there, the
//! database must exist and be migrated: an admin command never creates
//! one). `sources`, `backfill`, `destinations`, `producers` and `secrets`
//! need the daemon and take no `--offline`; `config show` reads only the
//! configuration. When no daemon answers, the error says so and names
//! `--offline` where it is allowed.
//!
//! Owns: that rule ([`Via`], [`ask`]), the offline opening of the
//! database ([`open_store`]), and how an answer or a refusal is printed.
//!
//! Besides the admin commands, two rooms of their own: [`health`] (the
//! daemon's `/health` for a container's probe) and [`selfdoc`] (the CLI's
//! completions, man pages and Markdown reference).
//!
//! Must never: decide anything an action decides, create state from a
//! read-only command, or hide an error the daemon gave.

pub mod admin;
pub mod client;
pub mod destinations;
pub mod health;
pub mod producers;
pub mod progress;
pub mod secrets;
pub mod selfdoc;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use outboxd::config::Config;
use outboxd::ops::actions::AdminError;
use outboxd::store::Store;
use serde::de::DeserializeOwned;

use client::{DaemonAt, DaemonClientError, Refused};

/// The commands that take `--offline`, as the hint names them.
const OFFLINE_COMMANDS: &str = "events, attempts, dead and sinks";

/// Where an admin command that may run offline does its work.
pub enum Via {
    /// The running daemon's admin API.
    Daemon(DaemonAt),
    /// The database itself (`--offline`).
    Offline(Arc<dyn Store>),
}

impl Via {
    /// The daemon `config` points at, or with `offline` its database
    /// (which must exist and be migrated).
    pub async fn of(config: &Config, offline: bool) -> anyhow::Result<Via> {
        Ok(if offline {
            Via::Offline(open_store(config).await?)
        } else {
            Via::Daemon(DaemonAt::of(config))
        })
    }
}

/// Whether a command may be run with `--offline` (for the error when no
/// daemon answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offline {
    /// It takes `--offline`.
    Allowed,
    /// It needs the daemon.
    Refused,
}

/// `method path` with `body` on the daemon, bounded by `timeout`: its
/// answer as `T`, or its refusal. No daemon answering is an error that
/// says what to do (start it, point `--listen` at it, or, where
/// `offline` allows, give `--offline`).
pub async fn ask<T: DeserializeOwned>(
    daemon: &DaemonAt,
    method: http::Method,
    path: &str,
    body: Option<serde_json::Value>,
    timeout: Duration,
    offline: Offline,
) -> anyhow::Result<Result<T, Refused>> {
    match client::request(daemon, method, path, body, timeout).await {
        Ok(answer) => Ok(answer),
        Err(e @ DaemonClientError::Unreachable { .. }) => Err(anyhow::anyhow!(match offline {
            Offline::Allowed => format!(
                "{e}; this command goes through the running daemon: start it (`outboxd run`), \
                 point --listen at it, or give --offline to work on the database directly \
                 (only {OFFLINE_COMMANDS} take --offline)"
            ),
            Offline::Refused => format!(
                "{e}; this command goes through the running daemon (it has no --offline): \
                 start it (`outboxd run`) or point --listen at it"
            ),
        })),
        Err(e) => Err(e.into()),
    }
}

/// Print a daemon's refusal as `outboxd: MESSAGE (HTTP STATUS)`; exit 1.
pub fn refused_with_status(refused: Refused) -> ExitCode {
    eprintln!("outboxd: {} (HTTP {})", refused.message, refused.status);
    ExitCode::FAILURE
}

/// An action's answer, asked of the daemon or run offline, printed with
/// `print`; a refusal printed as `outboxd: MESSAGE` (exit 1).
pub fn answer<T>(
    result: Result<T, Refusal>,
    print: impl FnOnce(T) -> anyhow::Result<()>,
) -> anyhow::Result<ExitCode> {
    match result {
        Ok(value) => {
            print(value)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(Refusal::Daemon(r)) => {
            eprintln!("outboxd: {}", r.message);
            Ok(ExitCode::FAILURE)
        }
        Err(Refusal::Offline(AdminError::Store(e))) => Err(e.into()),
        Err(Refusal::Offline(e)) => {
            eprintln!("outboxd: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Why an action did nothing: the daemon refused, or (offline) the action
/// did.
pub enum Refusal {
    /// The daemon's answer.
    Daemon(Refused),
    /// The action's error, offline.
    Offline(AdminError),
}

impl From<AdminError> for Refusal {
    fn from(e: AdminError) -> Refusal {
        Refusal::Offline(e)
    }
}

impl From<Refused> for Refusal {
    fn from(r: Refused) -> Refusal {
        Refusal::Daemon(r)
    }
}

/// Open the configured store for an `--offline` command: the database
/// must exist (an admin command never creates one) and its migrations be
/// current.
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let url = config.effective_database_url();
    if let Some(path) = outboxd::store::sqlite_path(&url) {
        if !std::path::Path::new(path).exists() {
            anyhow::bail!(
                "no database at {path}: nothing has run with this configuration yet \
                 (give --data-dir or --database-url of the daemon's database)"
            );
        }
    }
    let store = outboxd::store::open(&url).await?;
    let pending = store.pending_migrations().await?;
    if !pending.is_empty() {
        anyhow::bail!(
            "database has pending migrations: {}; run `outboxd migrate`",
            pending.join(", ")
        );
    }
    Ok(store)
}
