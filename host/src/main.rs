//! The `outboxd` command line: `run`, `migrate`, `plugin check|wit|new|run`,
//! and the admin commands.
//!
//! Owns: parsing flags into a partial configuration (flags win over the
//! environment and the file, see [`outboxd::config`]), logging set-up, exit
//! codes and signal handling.
//!
//! Must never: hold behaviour of its own beyond wiring; everything else is
//! in the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

mod cli_destinations;

use clap::{Args, Parser, Subcommand};
use outboxd::config::{Config, LogFormat};
use outboxd::daemon::{Daemon, Migrations};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "outboxd",
    version,
    about = "Durable event delivery with WebAssembly sinks"
)]
struct Cli {
    /// TOML configuration file (also OUTBOXD_CONFIG).
    #[arg(long, global = true, env = "OUTBOXD_CONFIG")]
    config: Option<PathBuf>,
    /// Options that override configuration keys; like `--config`, they may
    /// stand before or after the subcommand.
    #[command(flatten)]
    flags: Flags,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: HTTP API and one delivery loop per sink.
    Run {
        /// Apply pending database migrations before starting.
        #[arg(long)]
        migrate: bool,
    },
    /// Apply pending database migrations and exit.
    Migrate,
    /// Inspect plugins.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Show an event and its deliveries.
    Events {
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// List, replay or purge dead letters.
    Dead {
        #[command(subcommand)]
        command: DeadCommand,
    },
    /// List, pause or resume sinks (shared by every replica).
    Sinks {
        #[command(subcommand)]
        command: SinksCommand,
    },
    /// Create, change, list, pause, resume or delete destinations (the
    /// targets of sinks, kept in the database), through the running daemon
    /// (at `listen`), which checks them against its plugins.
    Destinations {
        #[command(subcommand)]
        command: cli_destinations::DestinationsCommand,
    },
    /// Show the configured sources and their status, as the running daemon
    /// (at `listen`) reports them.
    Sources {
        #[command(subcommand)]
        command: SourcesCommand,
    },
    /// Create deliveries for a (new) sink over past events, by the routes;
    /// running it twice creates nothing new.
    Backfill {
        #[arg(long)]
        sink: String,
        /// Events ingested at or after this time (RFC 3339). Default: all.
        #[arg(long)]
        since: Option<String>,
    },
    /// Show the effective configuration, secrets redacted.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand)]
enum EventsCommand {
    /// Print an event and its deliveries as JSON.
    Show { id: String },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the merged configuration (file, environment, flags) as TOML.
    Show,
}

/// Which dead letters: every given option must match.
#[derive(Args)]
struct DeadSelection {
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
    /// At most this many.
    #[arg(long, default_value_t = 1000)]
    limit: u32,
}

#[derive(Subcommand)]
enum DeadCommand {
    /// List dead letters with their reasons, newest first.
    List(DeadSelection),
    /// Make dead letters pending again (attempts and window start afresh).
    Replay(DeadSelection),
    /// Delete dead letters.
    Purge(DeadSelection),
}

#[derive(Subcommand)]
enum SinksCommand {
    /// Sinks with paused state.
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
enum SourcesCommand {
    /// One line per source: name, kind, ready, last cycle age, last error.
    List,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Load a component, check it against the outboxd:sink world, and print
    /// its imports, exports and the verdict (exit 1 when refused).
    Check {
        /// The component (`.wasm`).
        file: PathBuf,
        /// Its manifest; default: the `.toml` beside it, if present.
        #[arg(long)]
        manifest: Option<PathBuf>,
    },
    /// Write the WIT this binary speaks (`sink.wit`) into a folder.
    Wit {
        /// Folder to write into (created when missing).
        #[arg(long, default_value = "wit")]
        out: PathBuf,
    },
    /// Create a sink project outside this repository: WIT, build settings,
    /// manifest, README and unit tests, ready to build into a component.
    New {
        /// Sink name (lower-case letters, digits, '-' and '_'); also the
        /// project folder's name.
        name: String,
        /// Language of the project.
        #[arg(long, value_enum, default_value = "rust")]
        lang: NewLang,
        /// Folder to create the project in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Run sample events through a plugin, as the daemon would (fresh
    /// sandbox per batch, `init` then `deliver`, the manifest's grants and
    /// limits), and print each outcome and the plugin's log lines. No
    /// database, nothing retried.
    Run {
        /// The component (`.wasm`).
        file: PathBuf,
        /// Its manifest; default: the `.toml` beside it.
        #[arg(long)]
        manifest: Option<PathBuf>,
        /// CloudEvents in the JSON format, one per line.
        #[arg(long)]
        events: PathBuf,
        /// Lowest level of the plugin's log lines shown (RUST_LOG, when
        /// set, wins).
        #[arg(long, value_enum, default_value = "info")]
        log_level: PluginLogLevel,
    },
}

/// `plugin new --lang`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum NewLang {
    Rust,
    Js,
    Python,
}

/// `plugin run --log-level`: the levels of the WIT's `log` interface.
#[derive(Clone, Copy, clap::ValueEnum)]
enum PluginLogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Flags that override configuration keys. Unset flags leave the key alone.
#[derive(Args, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
struct Flags {
    /// HTTP listen address [default: 127.0.0.1:8080].
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    /// Data folder for the embedded SQLite database [default: ./data].
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    /// Database URL (sqlite://PATH) [default: SQLite in the data folder].
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    database_url: Option<String>,
    /// Plugins folder [default: ./target/plugins].
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    plugins_dir: Option<PathBuf>,
    /// Log format.
    #[arg(long, global = true, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    log_format: Option<LogFormat>,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,wasmtime=warn,cranelift=warn")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outboxd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("outboxd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let flags = &cli.flags;
    match cli.command {
        Command::Run { migrate } => {
            let config = Config::load(cli.config.as_deref(), flags)?;
            init_logging(config.log_format);
            let mode = if migrate {
                Migrations::Apply
            } else {
                Migrations::RequireCurrent
            };
            let daemon = Daemon::start(config, mode).await?;
            shutdown_signal().await;
            tracing::info!("shutdown requested: finishing in-flight batches");
            daemon.shutdown().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate => {
            let config = Config::load(cli.config.as_deref(), flags)?;
            init_logging(config.log_format);
            let url = config.effective_database_url();
            let store = outboxd::store::open(&url).await?;
            let pending = store.pending_migrations().await?;
            store.migrate().await?;
            if pending.is_empty() {
                println!(
                    "{}: no pending migrations",
                    outboxd::store::redact_url(&url)
                );
            } else {
                println!(
                    "{}: applied {}",
                    outboxd::store::redact_url(&url),
                    pending.join(", ")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Events {
            command: EventsCommand::Show { id },
        } => {
            let store = open_store(cli.config.as_deref(), flags).await?;
            match store.event(&id).await? {
                None => {
                    eprintln!("no event with id {id:?}");
                    Ok(ExitCode::FAILURE)
                }
                Some((stored, deliveries)) => {
                    let ev = &stored.event;
                    let out = serde_json::json!({
                        "id": ev.id, "source": ev.source, "type": ev.ty, "subject": ev.subject,
                        "stream": ev.stream, "sequence": stored.sequence, "time": ev.time,
                        "datacontenttype": ev.datacontenttype, "ingested_at_ms": stored.ingested_at_ms,
                        "data_bytes": ev.data.len(), "deliveries": deliveries,
                    });
                    println!("{}", serde_json::to_string_pretty(&out)?);
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
        Command::Dead { command } => {
            let store = open_store(cli.config.as_deref(), flags).await?;
            let (sel, action) = match command {
                DeadCommand::List(s) => (s, "list"),
                DeadCommand::Replay(s) => (s, "replay"),
                DeadCommand::Purge(s) => (s, "purge"),
            };
            let parse = |t: &Option<String>, flag: &str| -> anyhow::Result<Option<i64>> {
                t.as_deref()
                    .map(|t| {
                        time::OffsetDateTime::parse(
                            t,
                            &time::format_description::well_known::Rfc3339,
                        )
                        .map(|d| (d.unix_timestamp_nanos() / 1_000_000) as i64)
                        .map_err(|_| {
                            anyhow::anyhow!("--{flag}: expected an RFC 3339 time, got {t:?}")
                        })
                    })
                    .transpose()
            };
            let filter = outboxd::store::DeadFilter {
                sink: sel.sink,
                stream: sel.stream,
                event_id: sel.event,
                since_ms: parse(&sel.since, "since")?,
                until_ms: parse(&sel.until, "until")?,
            };
            match action {
                "list" => {
                    for d in store.list_dead(&filter, sel.limit).await? {
                        println!(
                            "{}\t{}\t{}#{}\tattempts={}\t{}",
                            d.event_id,
                            d.sink,
                            d.stream,
                            d.sequence,
                            d.attempts,
                            d.reason.unwrap_or_default()
                        );
                    }
                }
                "replay" => println!("replayed {}", store.replay_dead(&filter, sel.limit).await?),
                _ => println!("purged {}", store.purge_dead(&filter, sel.limit).await?),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Sinks { command } => {
            let store = open_store(cli.config.as_deref(), flags).await?;
            match command {
                SinksCommand::List => {
                    let paused = store.paused_sinks().await?;
                    let config = Config::load(cli.config.as_deref(), flags)?;
                    let runtime =
                        outboxd::plugin::Runtime::new().map_err(|e| anyhow::anyhow!("{e}"))?;
                    let plugins = outboxd::plugin::load_dir(&runtime, &config.plugins_dir);
                    // Quarantines live in the daemon's process: ask it.
                    let quarantines = outboxd::ops::daemon_client::quarantines(
                        config.listen,
                        config.admin.token.as_deref(),
                    )
                    .await;
                    if let Err(e) = &quarantines {
                        eprintln!("quarantine state unknown: {e}");
                    }
                    for sink in plugins.known_sinks() {
                        let state = if paused.contains(&sink) {
                            "paused"
                        } else {
                            "active"
                        };
                        let loaded = if plugins.loaded.contains_key(&sink) {
                            "loaded"
                        } else {
                            "refused"
                        };
                        let quarantine = match quarantines.as_ref().map(|q| q.get(&sink)) {
                            Ok(Some(q)) => format!(
                                "\tquarantined until {} ({})",
                                q["until"].as_str().unwrap_or("?"),
                                q["reason"].as_str().unwrap_or("?")
                            ),
                            _ => String::new(),
                        };
                        println!("{sink}\t{state}\t{loaded}{quarantine}");
                    }
                }
                SinksCommand::Pause { sink } => {
                    store.set_paused(&sink, true).await?;
                    println!("{sink}: paused");
                }
                SinksCommand::Resume { sink } => {
                    store.set_paused(&sink, false).await?;
                    println!("{sink}: resumed");
                }
                SinksCommand::Retire { sink } => {
                    if !store.retire_sink(&sink).await? {
                        anyhow::bail!("no registered sink {sink:?} that is not retired already");
                    }
                    println!(
                        "{sink}: retired; no replica routes new events to it (within 2 s); \
                         deliveries already queued stay and are delivered by a replica that has it loaded"
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Destinations { command } => {
            let config = Config::load(cli.config.as_deref(), flags)?;
            cli_destinations::run(&config, command).await
        }
        Command::Sources {
            command: SourcesCommand::List,
        } => {
            // Source status lives in the daemon's process: ask it.
            let config = Config::load(cli.config.as_deref(), flags)?;
            let sources =
                outboxd::ops::daemon_client::sources(config.listen, config.admin.token.as_deref())
                    .await?;
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
        Command::Backfill { sink, since } => {
            let config = Config::load(cli.config.as_deref(), flags)?;
            let store = open_store(cli.config.as_deref(), flags).await?;
            let runtime = outboxd::plugin::Runtime::new().map_err(|e| anyhow::anyhow!("{e}"))?;
            let plugins = outboxd::plugin::load_dir(&runtime, &config.plugins_dir);
            let known = plugins.known_sinks();
            if !known.contains(&sink) {
                anyhow::bail!(
                    "no sink named {sink:?} in {} (known: {})",
                    config.plugins_dir.display(),
                    known.join(", ")
                );
            }
            let routes = outboxd::ingest::routes::Router::new(config.routes.clone(), known)?;
            let since_ms = match since {
                None => 0,
                Some(t) => {
                    let d = time::OffsetDateTime::parse(
                        &t,
                        &time::format_description::well_known::Rfc3339,
                    )
                    .map_err(|_| {
                        anyhow::anyhow!("--since: expected an RFC 3339 time, got {t:?}")
                    })?;
                    (d.unix_timestamp_nanos() / 1_000_000) as i64
                }
            };
            let (scanned, created) =
                outboxd::ingest::routes::backfill(&*store, &routes, &sink, since_ms).await?;
            println!("{sink}: scanned {scanned} events, created {created} deliveries");
            Ok(ExitCode::SUCCESS)
        }
        Command::Config {
            command: ConfigCommand::Show,
        } => {
            let mut config = Config::load(cli.config.as_deref(), flags)?;
            if config.admin.token.is_some() {
                config.admin.token = Some("***".into());
            }
            config.database_url = config
                .database_url
                .as_deref()
                .map(outboxd::store::redact_url);
            for source in config.sources.values_mut() {
                *source = source.redacted();
            }
            if let Some(awareness) = config.ingest.awareness.as_mut() {
                *awareness = awareness.redacted();
            }
            print!("{}", toml::to_string_pretty(&config)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin {
            command: PluginCommand::Check { file, manifest },
        } => {
            init_logging(LogFormat::Text);
            // The lease the daemon would run with: the same configuration
            // (file, environment, flags) and the same admission rule.
            let lease = Config::load(cli.config.as_deref(), flags)?.delivery.lease;
            let admit = move |p: &outboxd::plugin::Plugin| outboxd::daemon::admit_lease(p, lease);
            Ok(outboxd::plugin::check::run(&file, manifest.as_deref(), &admit).await)
        }
        Command::Plugin {
            command: PluginCommand::Wit { out },
        } => {
            for file in outboxd::plugin::wit::write_to(&out)? {
                println!("wrote {}", file.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin {
            command: PluginCommand::New { name, lang, dir },
        } => {
            let lang = match lang {
                NewLang::Rust => outboxd::plugin::scaffold::Lang::Rust,
                NewLang::Js => outboxd::plugin::scaffold::Lang::Js,
                NewLang::Python => outboxd::plugin::scaffold::Lang::Python,
            };
            let project = outboxd::plugin::scaffold::create(&name, lang, &dir)?;
            let build = match lang {
                outboxd::plugin::scaffold::Lang::Rust => {
                    "cargo build --release --target wasm32-wasip2"
                }
                outboxd::plugin::scaffold::Lang::Js => "npm install && npm run build",
                outboxd::plugin::scaffold::Lang::Python => "./build.sh",
            };
            println!(
                "created {}: build it with `{build}` there (see its README.md)",
                project.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin {
            command:
                PluginCommand::Run {
                    file,
                    manifest,
                    events,
                    log_level,
                },
        } => {
            // The plugin's lines (logged by the runtime, tagged with the
            // plugin's name) go to stdout among the outcomes.
            let level = match log_level {
                PluginLogLevel::Trace => "trace",
                PluginLogLevel::Debug => "debug",
                PluginLogLevel::Info => "info",
                PluginLogLevel::Warn => "warn",
                PluginLogLevel::Error => "error",
            };
            let filter =
                tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new(format!(
                        "warn,outboxd::plugin::runtime={level},wasmtime=warn,cranelift=warn"
                    ))
                });
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stdout)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
                .without_time()
                .init();
            let tally = outboxd::plugin::trial::run(
                &file,
                manifest.as_deref(),
                &events,
                &mut std::io::stdout(),
            )
            .await?;
            Ok(if tally.failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

/// Open the configured store for an admin command: the database must exist
/// (an admin command never creates one) and its migrations be current.
async fn open_store(
    file: Option<&std::path::Path>,
    flags: &Flags,
) -> anyhow::Result<std::sync::Arc<dyn outboxd::store::Store>> {
    let config = Config::load(file, flags)?;
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

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
