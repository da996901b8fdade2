//! The `outboxd` command line: `run`, `migrate`, `plugin check`.
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

use clap::{Args, Parser, Subcommand};
use outboxd::config::{Config, LogFormat};
use outboxd::daemon::{Daemon, Migrations};
use serde::Serialize;

#[derive(Parser)]
#[command(name = "outboxd", version, about = "Durable event delivery with WebAssembly sinks")]
struct Cli {
    /// TOML configuration file (also OUTBOXD_CONFIG).
    #[arg(long, global = true, env = "OUTBOXD_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: HTTP API and one delivery loop per sink.
    Run {
        #[command(flatten)]
        flags: Flags,
        /// Apply pending database migrations before starting.
        #[arg(long)]
        migrate: bool,
    },
    /// Apply pending database migrations and exit.
    Migrate {
        #[command(flatten)]
        flags: Flags,
    },
    /// Inspect plugins.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
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
}

/// Flags that override configuration keys. Unset flags leave the key alone.
#[derive(Args, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
struct Flags {
    /// HTTP listen address [default: 127.0.0.1:8080].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    /// Data folder for the embedded SQLite database [default: ./data].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    /// Database URL (sqlite://PATH) [default: SQLite in the data folder].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    database_url: Option<String>,
    /// Plugins folder [default: ./target/plugins].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    plugins_dir: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    log_format: Option<LogFormat>,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,wasmtime=warn,cranelift=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
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
    match cli.command {
        Command::Run { flags, migrate } => {
            let config = Config::load(cli.config.as_deref(), &flags)?;
            init_logging(config.log_format);
            let mode = if migrate { Migrations::Apply } else { Migrations::RequireCurrent };
            let daemon = Daemon::start(config, mode).await?;
            shutdown_signal().await;
            tracing::info!("shutdown requested: finishing in-flight batches");
            daemon.shutdown().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate { flags } => {
            let config = Config::load(cli.config.as_deref(), &flags)?;
            init_logging(config.log_format);
            let url = config.effective_database_url();
            let store = outboxd::store::open(&url).await?;
            let pending = store.pending_migrations().await?;
            store.migrate().await?;
            if pending.is_empty() {
                println!("{}: no pending migrations", outboxd::store::redact_url(&url));
            } else {
                println!("{}: applied {}", outboxd::store::redact_url(&url), pending.join(", "));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { command: PluginCommand::Check { file, manifest } } => {
            init_logging(LogFormat::Text);
            Ok(outboxd::plugin::check::run(&file, manifest.as_deref()))
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
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
