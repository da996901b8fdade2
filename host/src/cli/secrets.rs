//! `outboxd secrets …`: the CLI face of the secrets-at-rest admin actions
//! (`outboxd::ops::actions::secrets`, `/v1/admin/secrets`), through the
//! running daemon only, which holds the keyring.
//!
//! Owns: turning arguments into a request to the running daemon and
//! printing its answer. The daemon holds the keyring and re-seals; the CLI
//! decides nothing and never reads a key.
//!
//! Must never: touch the key file or the database itself, or hide an error
//! the daemon gave.

use clap::Subcommand;
use http::Method;
use outboxd::config::Config;
use serde_json::json;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum SecretsCommand {
    /// Which key seals, which keys the daemon holds, and how many stored
    /// secrets are under each key id (and how many are plain).
    Status,
    /// Reload the daemon's keyring and re-seal every stored secret under
    /// the current key (the last line of the key file). Old keys keep
    /// opening meanwhile; remove one from the key file only after this
    /// reported 0 values under it.
    RotateKey {
        /// First append a freshly generated key to the daemon's key file
        /// as the new current key (only when its keys come from a file).
        #[arg(long)]
        generate: bool,
    },
}

/// Run `command` against the daemon at `config.listen`; exit 1 when it
/// refused.
pub async fn run(config: &Config, command: SecretsCommand) -> anyhow::Result<ExitCode> {
    let (method, path, body) = match command {
        SecretsCommand::Status => (Method::GET, "/v1/admin/secrets", None),
        SecretsCommand::RotateKey { generate } => (
            Method::POST,
            "/v1/admin/secrets/rotate-key",
            Some(json!({ "generate": generate })),
        ),
    };
    super::destinations::ask(config, method, path, body).await
}
