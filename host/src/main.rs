//! The `outboxd` command line: `run`, `migrate`, `health`, `plugin
//! check|wit|new|run`, `completions` and `man` (the CLI documenting
//! itself, from this one clap `Command`), and the admin commands (the `cli` folder: each goes through the running
//! daemon's admin API, and only `events`, `attempts`, `dead` and `sinks` may open the
//! database instead, with `--offline`).
//!
//! Owns: parsing flags into a partial configuration (flags win over the
//! environment and the file, see [`outboxd::config`]; global options stand
//! before or after the subcommand), logging set-up, exit codes and signal
//! handling.
//!
//! Must never: hold behaviour of its own beyond wiring; everything else is
//! in the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

mod cli;

use clap::{Args, CommandFactory, Parser, Subcommand};
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
    /// Apply pending database migrations and exit, one at a time, with a
    /// progress bar on a terminal.
    Migrate,
    /// Inspect plugins.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Show an event and its deliveries, through the running daemon (at
    /// `listen`), or the database with `--offline`.
    Events {
        #[command(flatten)]
        offline: cli::admin::OfflineFlag,
        #[command(subcommand)]
        command: cli::admin::EventsCommand,
    },
    /// List failed attempts (time, duration, outcome, the receiver's
    /// status, reason), through the running daemon (at `listen`), or the
    /// database with `--offline`.
    Attempts {
        #[command(flatten)]
        offline: cli::admin::OfflineFlag,
        #[command(subcommand)]
        command: cli::admin::AttemptsCommand,
    },
    /// List, replay or purge dead letters, through the running daemon (at
    /// `listen`), or the database with `--offline`.
    Dead {
        #[command(flatten)]
        offline: cli::admin::OfflineFlag,
        #[command(subcommand)]
        command: cli::admin::DeadCommand,
    },
    /// List, pause, resume or retire sinks (shared by every replica),
    /// through the running daemon (at `listen`), or the database with
    /// `--offline`.
    Sinks {
        #[command(flatten)]
        offline: cli::admin::OfflineFlag,
        #[command(subcommand)]
        command: cli::admin::SinksCommand,
    },
    /// Create, change, list, pause, resume or delete destinations (the
    /// targets of sinks, kept in the database), through the running daemon
    /// (at `listen`), which checks them against its plugins.
    Destinations {
        #[command(subcommand)]
        command: cli::destinations::DestinationsCommand,
    },
    /// Create, list, revoke or rotate producers (who may post events over
    /// HTTP, each with its own token), through the running daemon (at
    /// `listen`).
    Producers {
        #[command(subcommand)]
        command: cli::producers::ProducersCommand,
    },
    /// Secrets at rest: re-seal every stored secret under the current key,
    /// through the running daemon (at `listen`).
    Secrets {
        #[command(subcommand)]
        command: cli::secrets::SecretsCommand,
    },
    /// Show the configured sources and their status, as the running daemon
    /// (at `listen`) reports them.
    Sources {
        #[command(subcommand)]
        command: cli::admin::SourcesCommand,
    },
    /// Create deliveries for a (new) sink over past events, by the routes,
    /// through the running daemon (at `listen`), with a spinner on a
    /// terminal while it works; running it twice creates nothing new.
    Backfill {
        /// The sink to create deliveries for.
        #[arg(long)]
        sink: String,
        /// Events ingested at or after this time (RFC 3339). Default: all.
        #[arg(long)]
        since: Option<String>,
    },
    /// Show the effective configuration, secrets redacted (reads only the
    /// configuration: no daemon, no database).
    Config {
        #[command(subcommand)]
        command: cli::admin::ConfigCommand,
    },
    /// Ask the running daemon (at `listen`) for `/health`: print its answer,
    /// exit 0 when it is 200 and 1 otherwise (a container's health check).
    Health,
    /// Print the shell completion script of this command line to stdout.
    ///
    /// Bash: `outboxd completions bash > /etc/bash_completion.d/outboxd`;
    /// zsh: into a folder of `$fpath` as `_outboxd`; fish: into
    /// `~/.config/fish/completions/outboxd.fish`.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout, or write one page per command
    /// with `--out`, or print the Markdown reference with `--markdown`.
    Man {
        /// Folder to write `outboxd.1`, `outboxd-run.1`, … into (created
        /// when missing).
        #[arg(long, conflicts_with = "markdown")]
        out: Option<PathBuf>,
        /// Print the manual's CLI reference (Markdown) instead.
        #[arg(long)]
        markdown: bool,
    },
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
        /// Certificate authorities (PEM) HTTPS trusts besides the webpki
        /// roots, as the daemon's `egress.ca-file`.
        #[arg(long)]
        ca_file: Option<PathBuf>,
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
    /// HTTP listen address; the admin commands go through the daemon
    /// listening there [default: 127.0.0.1:8080].
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
        .with_writer(std::io::stderr)
        .with_ansi(colour(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Whether log lines written to `stream` are coloured: only on a terminal
/// (escape codes in a file, a pipe or a journal are noise to whoever reads
/// them there), and never when `NO_COLOR` is set to a non-empty value
/// (<https://no-color.org>).
fn colour(stream: &impl std::io::IsTerminal) -> bool {
    stream.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
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

/// Run the command: each arm loads the configuration it needs and calls
/// the library (or the `cli` module that does).
async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let load = || Config::load(cli.config.as_deref(), &cli.flags);
    match cli.command {
        Command::Run { migrate } => run_daemon(load()?, migrate).await,
        Command::Migrate => migrate(load()?).await,
        Command::Events { offline, command } => {
            cli::admin::events(&load()?, offline.offline, command).await
        }
        Command::Attempts { offline, command } => {
            cli::admin::attempts(&load()?, offline.offline, command).await
        }
        Command::Dead { offline, command } => {
            cli::admin::dead(&load()?, offline.offline, command).await
        }
        Command::Sinks { offline, command } => {
            cli::admin::sinks(&load()?, offline.offline, command).await
        }
        Command::Sources { command } => cli::admin::sources(&load()?, command).await,
        Command::Backfill { sink, since } => cli::admin::backfill(&load()?, sink, since).await,
        Command::Config { command } => cli::admin::config(load()?, command),
        Command::Destinations { command } => cli::destinations::run(&load()?, command).await,
        Command::Producers { command } => cli::producers::run(&load()?, command).await,
        Command::Secrets { command } => cli::secrets::run(&load()?, command).await,
        Command::Plugin { command } => plugin(command, load).await,
        Command::Health => Ok(cli::health::run(&load()?).await),
        Command::Completions { shell } => {
            cli::selfdoc::completions(shell, Cli::command(), &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { out, markdown } => man(out, markdown),
    }
}

/// `outboxd man [--out DIR | --markdown]`.
fn man(out: Option<PathBuf>, markdown: bool) -> anyhow::Result<ExitCode> {
    use std::io::Write as _;
    let command = Cli::command();
    if markdown {
        std::io::stdout().write_all(cli::selfdoc::markdown(&command).as_bytes())?;
    } else if let Some(dir) = out {
        for page in cli::selfdoc::man_pages_to(command, &dir)? {
            println!("wrote {}", page.display());
        }
    } else {
        cli::selfdoc::man_page(command, &mut std::io::stdout())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `outboxd run`: until SIGTERM or SIGINT, then a graceful shutdown.
async fn run_daemon(config: Config, migrate: bool) -> anyhow::Result<ExitCode> {
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

/// `outboxd migrate`: the one command besides `run` that creates the
/// database.
async fn migrate(config: Config) -> anyhow::Result<ExitCode> {
    init_logging(config.log_format);
    let url = config.effective_database_url();
    let store = outboxd::store::open(&url).await?;
    let pending = store.pending_migrations().await?;
    if pending.is_empty() {
        store.migrate().await?;
    } else {
        let progress =
            crate::cli::progress::Progress::new("applying migrations", pending.len() as u64);
        let mut done = 0;
        store
            .migrate_each(&mut |name| {
                done += 1;
                progress.step(done, name);
            })
            .await?;
        progress.finish();
    }
    let url = outboxd::store::redact_url(&url);
    if pending.is_empty() {
        println!("{url}: no pending migrations");
    } else {
        println!("{url}: applied {}", pending.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

/// `outboxd plugin check|wit|new|run`; `load` gives the configuration
/// (only `check` needs it, for the lease).
async fn plugin(
    command: PluginCommand,
    load: impl FnOnce() -> Result<Config, outboxd::config::ConfigError>,
) -> anyhow::Result<ExitCode> {
    match command {
        PluginCommand::Check { file, manifest } => {
            init_logging(LogFormat::Text);
            // The lease the daemon would run with: the same configuration
            // (file, environment, flags) and the same admission rule.
            let lease = load()?.delivery.lease;
            let admit = move |p: &outboxd::plugin::Plugin| outboxd::daemon::admit_lease(p, lease);
            Ok(outboxd::plugin::check::run(&file, manifest.as_deref(), &admit).await)
        }
        PluginCommand::Wit { out } => {
            for file in outboxd::plugin::wit::write_to(&out)? {
                println!("wrote {}", file.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::New { name, lang, dir } => plugin_new(&name, lang, &dir),
        PluginCommand::Run {
            file,
            manifest,
            events,
            log_level,
            ca_file,
        } => {
            plugin_run(
                &file,
                manifest.as_deref(),
                &events,
                log_level,
                ca_file.as_deref(),
            )
            .await
        }
    }
}

/// `outboxd plugin new NAME`.
fn plugin_new(name: &str, lang: NewLang, dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    use outboxd::plugin::scaffold::Lang;
    let (lang, build) = match lang {
        NewLang::Rust => (Lang::Rust, "cargo build --release --target wasm32-wasip2"),
        NewLang::Js => (Lang::Js, "npm install && npm run build"),
        NewLang::Python => (Lang::Python, "./build.sh"),
    };
    let project = outboxd::plugin::scaffold::create(name, lang, dir)?;
    println!(
        "created {}: build it with `{build}` there (see its README.md)",
        project.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `outboxd plugin run FILE --events EVENTS`: exit 1 when any event
/// failed.
async fn plugin_run(
    file: &std::path::Path,
    manifest: Option<&std::path::Path>,
    events: &std::path::Path,
    log_level: PluginLogLevel,
    ca_file: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    // The plugin's lines (logged by the runtime, tagged with the
    // plugin's name) go to stdout among the outcomes.
    let level = match log_level {
        PluginLogLevel::Trace => "trace",
        PluginLogLevel::Debug => "debug",
        PluginLogLevel::Info => "info",
        PluginLogLevel::Warn => "warn",
        PluginLogLevel::Error => "error",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "warn,outboxd::plugin::runtime={level},wasmtime=warn,cranelift=warn"
        ))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stdout)
        .with_ansi(colour(&std::io::stdout()))
        .without_time()
        .init();
    let tally =
        outboxd::plugin::trial::run(file, manifest, events, ca_file, &mut std::io::stdout())
            .await?;
    Ok(if tally.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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
