//! `outboxd producers …`: the CLI face of the producer actions
//! (`outboxd::ops::actions::producers`), through the running daemon
//! only.
//!
//! Owns: turning arguments into a request to the running daemon's admin
//! API (`/v1/admin/producers`) and printing its answer. The daemon decides
//! everything.
//!
//! Must never: write producers to the database itself, or print a token
//! anywhere but the one answer that makes it.

use clap::{Args, Subcommand};
use http::Method;
use outboxd::config::Config;
use serde_json::{json, Value};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum ProducersCommand {
    /// Every producer: state, scope, limits; tokens shown as `obx_<id>_…`.
    List,
    /// Create a producer and print its token once (it is stored only as a
    /// digest and cannot be shown again).
    Create(CreateArgs),
    /// Revoke a producer: its tokens are refused from now on; the events
    /// it posted keep its name.
    Revoke {
        /// The producer's name.
        name: String,
    },
    /// Give a producer a new token (printed once); the current one stays
    /// accepted for `--grace` (default: refused at once).
    Rotate {
        /// The producer's name.
        name: String,
        /// e.g. `10m`.
        #[arg(long)]
        grace: Option<String>,
    },
}

/// `producers create`.
#[derive(Args)]
pub struct CreateArgs {
    /// 1 to 64 of `a-z 0-9 - _ .`.
    name: String,
    /// A prefix its events' `source` must have (repeatable). Default: any.
    #[arg(long = "source-prefix", value_name = "PREFIX")]
    sources: Vec<String>,
    /// Event types it may write (glob, repeatable). Default: any.
    #[arg(long = "type", value_name = "GLOB")]
    types: Vec<String>,
    /// Streams it may write (glob, repeatable). Default: any.
    #[arg(long = "stream", value_name = "GLOB")]
    streams: Vec<String>,
    /// Events per second, at most. Default: `producers.rate-per-second`.
    #[arg(long)]
    rate: Option<u32>,
    /// Request body bytes per second, at most. Default: no cap.
    #[arg(long)]
    bytes_per_second: Option<u64>,
    /// Its token is refused this long after creation (e.g. `90d`).
    #[arg(long)]
    expires_in: Option<String>,
}

/// Run `command` against the daemon the configuration points at.
pub async fn run(config: &Config, command: ProducersCommand) -> anyhow::Result<ExitCode> {
    let base = "/v1/admin/producers";
    let (method, path, body): (Method, String, Option<Value>) = match command {
        ProducersCommand::List => (Method::GET, base.into(), None),
        ProducersCommand::Create(a) => {
            let mut body = json!({
                "name": a.name,
                "scope": { "sources": a.sources, "types": a.types, "streams": a.streams },
            });
            for (key, value) in [
                ("rate_per_second", a.rate.map(Value::from)),
                ("bytes_per_second", a.bytes_per_second.map(Value::from)),
                ("expires_in", a.expires_in.map(Value::from)),
            ] {
                if let Some(value) = value {
                    body[key] = value;
                }
            }
            (Method::POST, base.into(), Some(body))
        }
        ProducersCommand::Revoke { name } => (Method::POST, format!("{base}/{name}/revoke"), None),
        ProducersCommand::Rotate { name, grace } => (
            Method::POST,
            format!("{base}/{name}/rotate"),
            Some(
                grace
                    .map(|g| json!({ "grace": g }))
                    .unwrap_or_else(|| json!({})),
            ),
        ),
    };
    super::destinations::ask(config, method, &path, body).await
}
