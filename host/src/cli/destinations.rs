//! `outboxd destinations …`: the CLI face of the destination actions
//! (`outboxd::ops::actions::destinations` and `…::sync`), through the
//! running daemon only: it checks every input against its loaded plugins.
//!
//! Owns: turning arguments into a request to the daemon's admin API
//! (`/v1/admin/destinations`) and printing its answer as JSON (through
//! [`ask`], which the other JSON-printing commands share). The CLI
//! decides nothing.
//!
//! Must never: write destinations to the database itself (the checks live
//! in the daemon), or hide an error the daemon gave.

use clap::{Args, Subcommand};
use http::Method;
use outboxd::config::Config;
use outboxd::limits::ADMIN_WRITE_TIMEOUT;
use outboxd::ops::actions::sync;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum DestinationsCommand {
    /// Every destination: state, health and queue, no secrets.
    List,
    /// One destination as JSON.
    Show {
        /// The destination's name.
        name: String,
    },
    /// Create a destination (refused when the name exists). Prints its
    /// secret once when one is generated.
    Create(CreateArgs),
    /// Create or replace a destination from a JSON spec file (the body of
    /// `PUT /v1/admin/destinations/{name}`); the same spec again changes
    /// nothing, so a job can sync destinations from a source of truth.
    Update {
        /// The destination's name.
        name: String,
        /// The spec, a JSON file.
        #[arg(long)]
        file: PathBuf,
    },
    /// Delete a destination; `--pending` says what happens to its
    /// deliveries not yet delivered.
    Delete {
        /// The destination's name.
        name: String,
        /// `park`: keep them waiting under its name; `purge`: delete them.
        #[arg(long, value_parser = ["park", "purge"])]
        pending: String,
    },
    /// Pause: nothing is claimed for it; events still queue for it.
    Pause {
        /// The destination's name.
        name: String,
    },
    /// Resume a paused or disabled destination.
    Resume {
        /// The destination's name.
        name: String,
    },
    /// Make the catch-all destinations match a platform list (JSON: an
    /// array of `{name, url, secret}`, or `{"platforms": [...], "sink",
    /// "config", "prefix", "backfill"}`): new platforms created and
    /// backfilled (24 h by default), changed ones updated, vanished ones
    /// paused (never deleted). Idempotent.
    Sync {
        /// The platform list.
        #[arg(long = "from")]
        from: PathBuf,
    },
    /// Rotate its signing secret; the previous one keeps signing beside the
    /// new one for the grace period.
    RotateSecret {
        /// The destination's name.
        name: String,
        /// The new secret (`whsec_…`); default: a generated one, printed
        /// once.
        #[arg(long)]
        secret: Option<String>,
        /// e.g. `1h`; default 24 h.
        #[arg(long)]
        grace: Option<String>,
    },
}

/// `destinations create`.
#[derive(Args)]
pub struct CreateArgs {
    /// Its name: letters, digits, `-`, `_`, `.`; at most 128 bytes; not a
    /// sink's name.
    name: String,
    /// The sink (plugin manifest `name`) that serves it.
    #[arg(long)]
    sink: String,
    /// Configuration for the plugin, `KEY=VALUE` (repeatable), merged
    /// over the manifest's `[config]` (`--config` is the daemon's
    /// configuration file, as for every command).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    settings: Vec<String>,
    /// Event types it takes (glob, repeatable). Default: all.
    #[arg(long = "type", value_name = "GLOB")]
    types: Vec<String>,
    /// Streams it takes (glob, repeatable). Default: all.
    #[arg(long = "stream", value_name = "GLOB")]
    streams: Vec<String>,
    /// Attribute condition, `NAME == GLOB` or `NAME != GLOB` (repeatable).
    #[arg(long = "where", value_name = "CONDITION")]
    conditions: Vec<String>,
    /// Signing secret; default: a generated `whsec_…`; `""`: none.
    #[arg(long)]
    secret: Option<String>,
    /// Events per second, at most.
    #[arg(long)]
    rate: Option<u32>,
    /// Events in flight at once, at most.
    #[arg(long)]
    max_in_flight: Option<u32>,
    /// Also queue the matching events stored since this time (RFC 3339).
    #[arg(long)]
    backfill_since: Option<String>,
    /// Create it paused.
    #[arg(long)]
    paused: bool,
}

/// Run `command` against the daemon the configuration points at.
pub async fn run(config: &Config, command: DestinationsCommand) -> anyhow::Result<ExitCode> {
    let (method, path, body) = request(command)?;
    ask(config, method, &path, body).await
}

/// `method path` with `body` on the daemon's admin API (no `--offline`:
/// these actions need the daemon); its answer printed as JSON (exit 0) or
/// its refusal on stderr (exit 1).
pub async fn ask(
    config: &Config,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<ExitCode> {
    let daemon = super::client::DaemonAt::of(config);
    let answer: Result<Value, _> = super::ask(
        &daemon,
        method,
        path,
        body,
        ADMIN_WRITE_TIMEOUT,
        super::Offline::Refused,
    )
    .await?;
    match answer {
        Ok(answer) => {
            println!("{}", serde_json::to_string_pretty(&answer)?);
            Ok(ExitCode::SUCCESS)
        }
        Err(refused) => Ok(super::refused_with_status(refused)),
    }
}

/// The admin API request `command` makes: method, path and JSON body.
fn request(command: DestinationsCommand) -> anyhow::Result<(Method, String, Option<Value>)> {
    let base = "/v1/admin/destinations";
    Ok(match command {
        DestinationsCommand::List => (Method::GET, base.to_string(), None),
        DestinationsCommand::Show { name } => (Method::GET, format!("{base}/{name}"), None),
        DestinationsCommand::Create(args) => {
            (Method::POST, base.to_string(), Some(create_body(args)?))
        }
        DestinationsCommand::Update { name, file } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let spec: Value = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{}: not JSON: {e}", file.display()))?;
            (Method::PUT, format!("{base}/{name}"), Some(spec))
        }
        DestinationsCommand::Sync { from } => {
            let text = std::fs::read_to_string(&from)
                .map_err(|e| anyhow::anyhow!("{}: {e}", from.display()))?;
            // Checked here too, so a bad file is named before any request.
            let req = sync::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", from.display()))?;
            (
                Method::POST,
                format!("{base}/sync"),
                Some(serde_json::to_value(req)?),
            )
        }
        DestinationsCommand::Delete { name, pending } => (
            Method::DELETE,
            format!("{base}/{name}?pending={pending}"),
            None,
        ),
        DestinationsCommand::Pause { name } => (Method::POST, format!("{base}/{name}/pause"), None),
        DestinationsCommand::Resume { name } => {
            (Method::POST, format!("{base}/{name}/resume"), None)
        }
        DestinationsCommand::RotateSecret {
            name,
            secret,
            grace,
        } => {
            let mut body = json!({});
            if let Some(s) = secret {
                body["secret"] = s.into();
            }
            if let Some(g) = grace {
                body["grace"] = g.into();
            }
            (
                Method::POST,
                format!("{base}/{name}/rotate-secret"),
                Some(body),
            )
        }
    })
}

/// The body of `POST /v1/admin/destinations` for `destinations create`.
fn create_body(args: CreateArgs) -> anyhow::Result<Value> {
    let config: BTreeMap<String, String> = args
        .settings
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow::anyhow!("--set {kv:?}: expected KEY=VALUE"))
        })
        .collect::<Result<_, _>>()?;
    let mut body = json!({
        "name": args.name, "sink": args.sink, "config": config,
        "filter": { "types": args.types, "streams": args.streams, "where": args.conditions },
    });
    for (key, value) in [
        ("secret", args.secret.map(Value::from)),
        ("rate_per_second", args.rate.map(Value::from)),
        ("max_in_flight", args.max_in_flight.map(Value::from)),
        ("backfill_since", args.backfill_since.map(Value::from)),
        ("state", args.paused.then(|| Value::from("paused"))),
    ] {
        if let Some(value) = value {
            body[key] = value;
        }
    }
    Ok(body)
}
