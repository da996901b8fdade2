//! `outboxd events|dead|sinks|sources|backfill|config …`: the CLI face of
//! the admin actions in [`outboxd::ops::actions`], the same ones the HTTP
//! admin API calls, so both answer alike.
//!
//! Owns: turning arguments into an action's input (RFC 3339 flags read by
//! [`actions::parse_time`]), opening the database for the actions that work
//! on it, asking the running daemon for what lives in its process (sinks'
//! loaded state, sources, and a backfill, which needs its routes and
//! plugins), and printing each answer.
//!
//! Must never: create state from a read-only command (a missing SQLite
//! file is named, not created), decide anything an action decides, or
//! hide an error the daemon gave.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Subcommand};
use outboxd::config::Config;
use outboxd::ops::actions::{self, AdminError, DeadSelection};
use outboxd::ops::daemon_client;
use outboxd::store::{DeadFilter, Store};

#[derive(Subcommand)]
pub enum EventsCommand {
    /// Print an event and its deliveries as JSON (what `GET
    /// /v1/admin/events/ID` answers).
    Show { id: String },
}

/// Which dead letters: every given option must match.
#[derive(Args)]
pub struct DeadArgs {
    #[arg(long)]
    sink: Option<String>,
    #[arg(long)]
    stream: Option<String>,
    /// One event's deliveries.
    #[arg(long)]
    event: Option<String>,
    /// Died at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Died before this time (RFC 3339).
    #[arg(long)]
    until: Option<String>,
    /// At most this many, 1 to 10000 [default: 100 for `list`, 10000 for
    /// `replay` and `purge`] (the rule of the admin API too).
    #[arg(long)]
    limit: Option<u32>,
}

#[derive(Subcommand)]
pub enum DeadCommand {
    /// List dead letters with their reasons, newest first: event id, sink,
    /// stream#sequence, attempts, reason (what `GET /v1/admin/dead`
    /// answers).
    List(DeadArgs),
    /// Make dead letters pending again (attempts and window start afresh).
    Replay(DeadArgs),
    /// Delete dead letters.
    Purge(DeadArgs),
}

#[derive(Subcommand)]
pub enum SinksCommand {
    /// Every sink with its state, as the running daemon (at `listen`)
    /// reports it: name, active or paused, state (loaded, quarantined until
    /// when and why, removed, refused, elsewhere), version.
    List,
    /// Pause a sink: nothing is claimed, nothing is lost.
    Pause { sink: String },
    /// Resume a paused sink.
    Resume { sink: String },
    /// Retire a sink from the fleet's registry: no replica routes new
    /// events to it; its queued deliveries are kept (and delivered by any
    /// replica that still has its plugin loaded).
    Retire { sink: String },
}

#[derive(Subcommand)]
pub enum SourcesCommand {
    /// One line per source: name, kind, ready, last cycle age, last error.
    List,
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Print the merged configuration (file, environment, flags) as TOML,
    /// secrets redacted.
    Show,
}

/// `outboxd events show ID`.
pub async fn events(config: &Config, command: EventsCommand) -> anyhow::Result<ExitCode> {
    let EventsCommand::Show { id } = command;
    let store = open_store(config).await?;
    answer(
        actions::show_event(&*store, &id).await,
        |view| -> anyhow::Result<()> {
            println!("{}", serde_json::to_string_pretty(&view)?);
            Ok(())
        },
    )
}

/// `outboxd dead list|replay|purge`.
pub async fn dead(config: &Config, command: DeadCommand) -> anyhow::Result<ExitCode> {
    let store = open_store(config).await?;
    match command {
        DeadCommand::List(args) => {
            let sel = selection(args)?;
            answer(actions::list_dead(&*store, &sel).await, |dead| {
                for d in &dead {
                    println!(
                        "{}\t{}\t{}#{}\tattempts={}\t{}",
                        d.event_id,
                        d.sink,
                        d.stream,
                        d.sequence,
                        d.attempts,
                        d.reason.as_deref().unwrap_or_default()
                    );
                }
                if dead.is_empty() {
                    eprintln!("no dead letters match");
                }
                Ok(())
            })
        }
        DeadCommand::Replay(args) => {
            let sel = selection(args)?;
            answer(actions::replay_dead(&*store, &sel).await, |n| {
                println!("replayed {n}");
                Ok(())
            })
        }
        DeadCommand::Purge(args) => {
            let sel = selection(args)?;
            answer(actions::purge_dead(&*store, &sel).await, |n| {
                println!("purged {n}");
                Ok(())
            })
        }
    }
}

/// The action's selection from the flags.
fn selection(args: DeadArgs) -> Result<DeadSelection, AdminError> {
    let time = |flag: &str, t: Option<String>| t.map(|t| actions::parse_time(flag, &t)).transpose();
    Ok(DeadSelection {
        filter: DeadFilter {
            sink: args.sink,
            stream: args.stream,
            event_id: args.event,
            since_ms: time("--since", args.since)?,
            until_ms: time("--until", args.until)?,
        },
        limit: args.limit,
    })
}

/// `outboxd sinks list|pause|resume|retire`.
pub async fn sinks(config: &Config, command: SinksCommand) -> anyhow::Result<ExitCode> {
    let (sink, paused) = match command {
        SinksCommand::List => return list_sinks(config).await,
        SinksCommand::Pause { sink } => (sink, true),
        SinksCommand::Resume { sink } => (sink, false),
        SinksCommand::Retire { sink } => return retire_sink(config, &sink).await,
    };
    let store = open_store(config).await?;
    let known = actions::registered_sinks(&*store).await?;
    answer(
        actions::set_paused(&*store, &known, &sink, paused).await,
        |()| {
            println!("{sink}: {}", if paused { "paused" } else { "resumed" });
            Ok(())
        },
    )
}

/// `outboxd sinks retire S`.
async fn retire_sink(config: &Config, sink: &str) -> anyhow::Result<ExitCode> {
    let store = open_store(config).await?;
    answer(actions::retire(&*store, sink).await, |()| {
        println!(
            "{sink}: retired; no replica routes new events to it once it reads the \
             registry again (every {:?}); deliveries already queued stay and are \
             delivered by a replica that has it loaded",
            outboxd::fleet::BEAT_EVERY
        );
        Ok(())
    })
}

/// `outboxd sinks list`: the daemon's answer, one line per sink. Loaded,
/// removed and quarantined state live in the daemon's process; when no
/// daemon answers, the fleet's registry in the database is shown instead,
/// with the state `unknown`.
async fn list_sinks(config: &Config) -> anyhow::Result<ExitCode> {
    let sinks = match daemon_client::sinks(&daemon_client::DaemonAt::of(config)).await {
        Ok(sinks) => sinks,
        Err(e) => {
            eprintln!("{e}; showing the sinks registered in the database, state unknown");
            return list_registered_sinks(config).await;
        }
    };
    for s in &sinks {
        let text = |key: &str| s[key].as_str().unwrap_or("-").to_string();
        let state = match s["quarantine"].as_object() {
            Some(q) => format!(
                "quarantined until {} ({})",
                q.get("until").and_then(|v| v.as_str()).unwrap_or("?"),
                q.get("reason").and_then(|v| v.as_str()).unwrap_or("?")
            ),
            None => text("state"),
        };
        // A refused version: the running one (if any) keeps serving.
        let state = match s["refused"].as_str() {
            Some(reason) if state == "loaded" => format!("loaded, replacement refused ({reason})"),
            Some(reason) => format!("{state} ({reason})"),
            None => state,
        };
        println!(
            "{}\t{}\t{state}\t{}\t{}",
            text("sink"),
            if s["paused"] == true {
                "paused"
            } else {
                "active"
            },
            text("version"),
            text("wasm_sha256"),
        );
    }
    if sinks.is_empty() {
        eprintln!("no sinks: the daemon at {} has none loaded", config.listen);
    }
    Ok(ExitCode::SUCCESS)
}

/// `outboxd sinks list` without a daemon: the registry's sinks.
async fn list_registered_sinks(config: &Config) -> anyhow::Result<ExitCode> {
    let store = open_store(config).await?;
    let paused = store.paused_sinks().await?;
    for s in store.registered_sinks().await? {
        let state = if s.retired_at_ms.is_some() {
            "retired"
        } else {
            "unknown"
        };
        let active = if paused.contains(&s.name) {
            "paused"
        } else {
            "active"
        };
        println!("{}\t{active}\t{state}\t{}", s.name, s.version);
    }
    Ok(ExitCode::SUCCESS)
}

/// `outboxd sources list`: source status lives in the daemon's process.
pub async fn sources(config: &Config, command: SourcesCommand) -> anyhow::Result<ExitCode> {
    let SourcesCommand::List = command;
    let sources = daemon_client::sources(&daemon_client::DaemonAt::of(config)).await?;
    for s in sources {
        let age = match s["last_cycle_age_ms"].as_u64() {
            Some(ms) => format!("last cycle {ms} ms ago"),
            None => "no cycle yet".to_string(),
        };
        println!(
            "{}\t{}\t{}\t{age}\t{}",
            s["name"].as_str().unwrap_or(""),
            s["kind"].as_str().unwrap_or(""),
            if s["ok"] == true {
                "ready"
            } else {
                "not ready"
            },
            s["last_error"].as_str().unwrap_or("-"),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `outboxd backfill --sink S [--since T]`, through the running daemon
/// (`POST /v1/admin/backfill`): it has the routes and the plugins, and
/// wakes its delivery loops for the deliveries created.
pub async fn backfill(
    config: &Config,
    sink: String,
    since: Option<String>,
) -> anyhow::Result<ExitCode> {
    let since_ms = match since {
        Some(t) => actions::parse_time("--since", &t)?,
        None => 0,
    };
    let (status, answer) = daemon_client::call(
        &daemon_client::DaemonAt::of(config),
        http::Method::POST,
        "/v1/admin/backfill",
        Some(serde_json::json!({ "sink": sink, "since_ms": since_ms })),
        Some(outboxd::limits::ADMIN_WRITE_TIMEOUT),
    )
    .await?;
    if status != 200 {
        eprintln!(
            "outboxd: {} (HTTP {status})",
            answer["error"]
                .as_str()
                .unwrap_or("the daemon refused the backfill")
        );
        return Ok(ExitCode::FAILURE);
    }
    println!(
        "{sink}: scanned {} events, created {} deliveries",
        answer["scanned"], answer["created"]
    );
    Ok(ExitCode::SUCCESS)
}

/// `outboxd config show`.
pub fn config(config: Config, command: ConfigCommand) -> anyhow::Result<ExitCode> {
    let ConfigCommand::Show = command;
    print!(
        "{}",
        toml::to_string_pretty(&actions::shown_config(config))?
    );
    Ok(ExitCode::SUCCESS)
}

/// Print an action's result with `print`, or its error on stderr (exit 1).
fn answer<T>(
    result: Result<T, AdminError>,
    print: impl FnOnce(T) -> anyhow::Result<()>,
) -> anyhow::Result<ExitCode> {
    match result {
        Ok(value) => {
            print(value)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(AdminError::Store(e)) => Err(e.into()),
        Err(e) => {
            eprintln!("outboxd: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Open the configured store for an admin command: the database must exist
/// (an admin command never creates one) and its migrations be current.
async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
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
