//! The settings of ingest, as `outboxd.toml` writes them: `[ingest]`
//! ([`IngestConfig`]) and `[ingest.awareness]` ([`AwarenessIngestConfig`]).
//! `crate::config` gathers them with every other room's settings
//! (`[[routes]]` are `crate::routing`'s).
//!
//! Must never: import `crate::config` (it imports these), or read the
//! environment except to resolve a `${VAR}` the operator wrote.

use serde::{Deserialize, Serialize};

/// The awareness route's default path (the service's
/// `router.post("/ingest", ...)`).
pub const DEFAULT_PATH: &str = "/ingest";

/// Limits applied to `POST /v1/events`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct IngestConfig {
    /// Largest request body accepted, in bytes (413 beyond). Default 1 MiB.
    pub max_body_bytes: usize,
    /// Most events in one batch request (413 beyond). Default 1000.
    pub max_batch_items: usize,
    /// The awareness-compatible `POST /ingest` (`[ingest.awareness]`).
    /// Unset: not mounted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub awareness: Option<AwarenessIngestConfig>,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            max_body_bytes: 1 << 20,
            max_batch_items: 1000,
            awareness: None,
        }
    }
}

/// Paths the daemon already serves; `path` may not take one of them.
const RESERVED_PATHS: &[&str] = &["/health", "/ready", "/metrics"];

/// `[ingest.awareness]`: the awareness-compatible `POST /ingest`. The
/// table's presence mounts the route (unless `enabled = false`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AwarenessIngestConfig {
    /// Mount the route. Default true: writing the table enables it.
    #[serde(default = "enabled_default")]
    pub enabled: bool,
    /// The shared secret producers send in `x-ingest-secret`. Write it as a
    /// `${VAR}` reference so it comes from the environment (resolved at
    /// start like manifest and source settings); never logged, shown as
    /// written when it is a bare reference and as `***` otherwise by
    /// `outboxd config show`. Required and non-empty: unlike the service,
    /// which skips the check when its secret is unset, outboxd never serves
    /// an open ingest.
    pub secret: String,
    /// Path of the route. Default [`DEFAULT_PATH`]. A literal path starting
    /// with `/`, outside `/v1/` and the operations endpoints.
    #[serde(default = "path_default")]
    pub path: String,
}

fn enabled_default() -> bool {
    true
}

fn path_default() -> String {
    DEFAULT_PATH.to_string()
}

impl AwarenessIngestConfig {
    /// The secret with `${VAR}` references resolved. Errors name the
    /// variable, never a value.
    pub fn resolved_secret(&self) -> Result<String, String> {
        let secret = crate::plugin::manifest::interpolate(&self.secret)?;
        if secret.is_empty() {
            return Err("must not be empty".into());
        }
        Ok(secret)
    }

    /// Check what types alone cannot. `Err((key, problem))` names the key
    /// under `ingest.awareness.`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if !self.enabled {
            return Ok(());
        }
        self.resolved_secret()
            .map_err(|p| ("secret".to_string(), p))?;
        let path = self.path.as_str();
        let bad = |problem: String| Err(("path".to_string(), problem));
        if !path.starts_with('/') || path.len() < 2 {
            return bad(format!(
                "{path:?} must be a path starting with \"/\", such as \"/ingest\""
            ));
        }
        if !path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-._~".contains(&b))
        {
            return bad(format!(
                "{path:?} must be a literal path (letters, digits, \"/\", \"-\", \".\", \"_\", \"~\")"
            ));
        }
        if path == "/v1" || path.starts_with("/v1/") || RESERVED_PATHS.contains(&path) {
            return bad(format!(
                "{path:?} is served by outboxd itself (/v1/..., /health, /ready, /metrics): pick another"
            ));
        }
        Ok(())
    }

    /// The same configuration with the secret hidden, for `outboxd config
    /// show`: a bare `${VAR}` reference is shown as written, anything else
    /// as `***`.
    pub fn redacted(&self) -> AwarenessIngestConfig {
        let bare_reference = self
            .secret
            .strip_prefix("${")
            .and_then(|s| s.strip_suffix('}'))
            .is_some_and(|var| {
                !var.is_empty() && var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            });
        AwarenessIngestConfig {
            secret: if bare_reference {
                self.secret.clone()
            } else {
                "***".into()
            },
            ..self.clone()
        }
    }
}
