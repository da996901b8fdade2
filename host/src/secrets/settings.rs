//! The settings of secrets at rest, as `outboxd.toml` writes them:
//! `[secrets]` ([`SecretsConfig`]). `crate::config` gathers them with
//! every other room's settings.
//!
//! Must never: import `crate::config` (it imports these), read the
//! environment, or show a key (`Debug` prints `***`, `config show` too).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Secrets at rest (`[secrets]`): the operator's keys, which every
/// credential kept in the database (destination secrets, credential
/// `config` values) is sealed under (AES-256-GCM; see `crate::secrets`).
/// Neither set: the embedded SQLite default generates
/// `<data-dir>/secrets.key` (mode 0600) and uses it; PostgreSQL refuses to
/// store a secret until one is set. Its `Debug` form hides `key`.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct SecretsConfig {
    /// A key file: one key per line, `KEY-ID BASE64-32-BYTES` (`#`
    /// comments); the last line is the current key (it seals), earlier
    /// lines only open. Read at start and again on `secrets rotate-key`
    /// (and when a value names a key id not yet read).
    pub key_file: Option<PathBuf>,
    /// The same lines separated by `,`, for the environment
    /// (`OUTBOXD_SECRETS__KEY`). Never logged; `config show` prints `***`.
    pub key: Option<String>,
}

impl SecretsConfig {
    /// `Err((key, problem))` when both `key-file` and `key` are set (which
    /// one would win is not obvious, so neither does).
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.key_file.is_some() && self.key.is_some() {
            return Err((
                "key",
                "set either secrets.key-file or secrets.key (OUTBOXD_SECRETS__KEY), not both"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The settings as `config show` prints them: `key` replaced by `***`.
    pub fn redacted(&self) -> SecretsConfig {
        SecretsConfig {
            key_file: self.key_file.clone(),
            key: self.key.as_ref().map(|_| "***".into()),
        }
    }
}

impl std::fmt::Debug for SecretsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsConfig")
            .field("key_file", &self.key_file)
            .field("key", &self.key.as_ref().map(|_| "***"))
            .finish()
    }
}
