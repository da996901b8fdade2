//! The one typed configuration of the daemon.
//!
//! Owns: the composition of every room's settings into one [`Config`]
//! (each room defines its own: `delivery::settings`,
//! `destinations::settings`, `ingest::settings`, `routing::settings`,
//! `secrets::settings`, `auth`, `sources`, `tls`; the few process-wide
//! knobs — `[admin]`, `[metrics]`, `[console]` — are here), the form
//! `config show` prints ([`Config::redacted`]), and the precedence rule —
//! command-line flags win over `OUTBOXD_*` environment variables, which
//! win over the TOML file, which wins over the defaults.
//! Environment keys map to config keys by lower-casing, `__` for nesting and
//! `_` for `-`: `OUTBOXD_DELIVERY__BATCH_SIZE` → `delivery.batch-size`.
//!
//! Must never: read configuration anywhere else, or hold a duration as a bare
//! integer of unknown unit (durations are `Duration`, written "30s", "5m").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::delivery::settings::DeliveryConfig;
use crate::destinations::settings::DestinationsConfig;
use crate::ingest::settings::IngestConfig;
use crate::routing::Route;
use crate::secrets::settings::SecretsConfig;

/// Errors found while reading or validating the configuration. Each names
/// the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The merged sources do not form a valid `Config` (wrong type, unknown
    /// key, unparsable duration...). The message names the key and source.
    #[error("configuration: {0}")]
    Invalid(String),
    /// A value is well-formed but not allowed.
    #[error("configuration key `{key}`: {problem}")]
    Value {
        /// The key, as written in the file (`delivery.lease`).
        key: String,
        /// What is wrong with its value.
        problem: String,
    },
}

/// The effective configuration of `outboxd run`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Config {
    /// Address of the HTTP API (ingest, read API, health). Default
    /// `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// Folder for the embedded SQLite database (`outboxd.db`) and the
    /// compiled-plugin cache. Default `./data`.
    pub data_dir: PathBuf,
    /// Database URL. Unset: SQLite at `<data-dir>/outboxd.db`.
    /// `sqlite://PATH` picks another SQLite file.
    pub database_url: Option<String>,
    /// Folder scanned at start for plugin manifests (`NAME.toml`) and their
    /// components. Default `./target/plugins`, where
    /// `scripts/build-plugins.sh` puts the shipped plugins.
    pub plugins_dir: PathBuf,
    /// Routes from events to sinks. Unset: every event goes to every sink.
    /// Set (even to an empty list): an event goes to the sinks of every
    /// route it matches, and an event matching none is stored but creates no
    /// delivery.
    pub routes: Option<Vec<Route>>,
    /// Limits of the ingest API.
    pub ingest: IngestConfig,
    /// The delivery loop's knobs.
    pub delivery: DeliveryConfig,
    /// Log format: `text` (default) or `json`.
    pub log_format: LogFormat,
    /// Admin API settings.
    pub admin: AdminConfig,
    /// Sources outboxd pulls events from, by name (`[sources.NAME]`, with
    /// `kind = "couchdb"`, ...). Default none.
    pub sources: std::collections::BTreeMap<String, crate::sources::SourceConfig>,
    /// Destinations (configured targets of sinks, kept in the database).
    pub destinations: DestinationsConfig,
    /// Producer authentication of the HTTP ingest (`[producers]`).
    pub producers: crate::auth::ProducersConfig,
    /// TLS on the HTTP listener (`[tls]`). Unset: plain HTTP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::tls::TlsConfig>,
    /// `/metrics` (`[metrics]`).
    pub metrics: MetricsConfig,
    /// The key the secrets kept in the database are sealed under.
    pub secrets: SecretsConfig,
    /// Traces over OTLP (`[otel]`). Default off.
    pub otel: crate::otel::OtelConfig,
    /// The operator console (`[console]`). Default on, under `/console`.
    pub console: ConsoleConfig,
    /// Outbound requests (`[egress]`): the CA file plugins' and the OTLP
    /// exporter's HTTPS trust besides the webpki roots.
    pub egress: crate::plugin::egress::EgressConfig,
}

/// `[metrics]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct MetricsConfig {
    /// Whether `/metrics` needs the admin token (`Authorization: Bearer
    /// <admin.token>`). Unset: off on a loopback listener, on beyond it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub require_token: Option<bool>,
}

/// The admin API (`/v1/admin/...`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AdminConfig {
    /// Bearer token required by every admin request. Unset: the admin API
    /// answers only when the daemon listens on a loopback address (and the
    /// daemon refuses to listen elsewhere without a token).
    pub token: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from("data"),
            database_url: None,
            plugins_dir: PathBuf::from("target/plugins"),
            routes: None,
            ingest: IngestConfig::default(),
            delivery: DeliveryConfig::default(),
            log_format: LogFormat::Text,
            admin: AdminConfig::default(),
            sources: Default::default(),
            destinations: DestinationsConfig::default(),
            producers: Default::default(),
            tls: None,
            metrics: MetricsConfig::default(),
            secrets: SecretsConfig::default(),
            otel: crate::otel::OtelConfig::default(),
            console: Default::default(),
            egress: Default::default(),
        }
    }
}

/// The top-level keys of [`Config`] (`listen`, `data-dir`, ...).
fn top_level_keys() -> Vec<String> {
    let mut keys: Vec<String> = match serde_json::to_value(Config::default()) {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    };
    // Optional keys are absent from the serialised default.
    keys.extend([
        "database-url".to_string(),
        "routes".to_string(),
        "tls".to_string(),
    ]);
    keys
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl Config {
    /// Merge defaults ← TOML file (when given) ← `OUTBOXD_*` environment ←
    /// `overrides` (the command-line flags, as a partial config), then
    /// validate.
    ///
    /// Errors: a missing or malformed file, an unknown key, a value of the
    /// wrong type — each naming the key.
    pub fn load(file: Option<&Path>, overrides: impl Serialize) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::Invalid(format!(
                    "file {} does not exist",
                    file.display()
                )));
            }
            figment = figment.merge(Toml::file(file));
        }
        figment = figment
            .merge(
                Env::prefixed("OUTBOXD_")
                    // Only variables naming a config key: plugin manifests
                    // may read other OUTBOXD_* variables of their own.
                    .filter(|key| {
                        let top = key
                            .as_str()
                            .split("__")
                            .next()
                            .unwrap_or("")
                            .replace('_', "-")
                            .to_ascii_lowercase();
                        top_level_keys().contains(&top)
                    })
                    .map(|key| key.as_str().replace("__", ".").replace('_', "-").into()),
            )
            .merge(Serialized::defaults(overrides));
        let config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Check the values that types alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let value = |key: &str, problem: &str| {
            Err(ConfigError::Value {
                key: key.to_string(),
                problem: problem.to_string(),
            })
        };
        if self.ingest.max_body_bytes == 0 {
            return value("ingest.max-body-bytes", "must be greater than 0");
        }
        if self.ingest.max_batch_items == 0 {
            return value("ingest.max-batch-items", "must be greater than 0");
        }
        if let Err((key, problem)) = self.delivery.validate() {
            return value(&format!("delivery.{key}"), &problem);
        }
        if !self.listen.ip().is_loopback() && self.admin.token.as_deref().unwrap_or("").is_empty() {
            return value(
                "admin.token",
                &format!(
                    "listen is {} (not loopback): set admin.token (OUTBOXD_ADMIN__TOKEN) so the admin API is not open",
                    self.listen
                ),
            );
        }
        if let Err((key, problem)) = self.producers.mode_for(self.listen) {
            return value(&key, &problem);
        }
        if self.producers.rate_per_second == 0 {
            return value("producers.rate-per-second", "must be greater than 0");
        }
        if let Some(tls) = &self.tls {
            if let Err((key, problem)) = tls.validate() {
                return value(&format!("tls.{key}"), &problem);
            }
        }
        if self.metrics_require_token() && self.admin.token.as_deref().unwrap_or("").is_empty() {
            return value(
                "metrics.require-token",
                "is on (the default beyond loopback) but admin.token is not set",
            );
        }
        if let Some(awareness) = &self.ingest.awareness {
            if let Err((key, problem)) = awareness.validate() {
                return value(&format!("ingest.awareness.{key}"), &problem);
            }
        }
        for (name, source) in &self.sources {
            if let Err((key, problem)) = source.validate() {
                return value(&format!("sources.{name}.{key}"), &problem);
            }
        }
        if let Err((key, problem)) = self.secrets.validate() {
            return value(&format!("secrets.{key}"), &problem);
        }
        if let Err((key, problem)) = self.otel.validate() {
            return value(&format!("otel.{key}"), &problem);
        }
        if let Err((key, problem)) = self.console.validate() {
            return value(&format!("console.{key}"), &problem);
        }
        if self
            .egress
            .ca_file
            .as_ref()
            .is_some_and(|f| f.as_os_str().is_empty())
        {
            return value("egress.ca-file", "is empty");
        }
        if let Some(routes) = &self.routes {
            if let Err((key, problem)) = crate::routing::settings::validate(routes) {
                return value(&key, &problem);
            }
        }
        Ok(())
    }

    /// Whether `/metrics` needs the admin token: `metrics.require-token`,
    /// else whether `listen` is beyond loopback.
    pub fn metrics_require_token(&self) -> bool {
        self.metrics
            .require_token
            .unwrap_or(!self.listen.ip().is_loopback())
    }

    /// The configuration as `outboxd config show` prints it: the admin
    /// token, the secrets key (`secrets.key`), the database password and
    /// every source's and the awareness ingest's secrets replaced by `***`.
    pub fn redacted(mut self) -> Config {
        if self.admin.token.is_some() {
            self.admin.token = Some("***".into());
        }
        self.secrets = self.secrets.redacted();
        self.database_url = self.database_url.as_deref().map(crate::store::redact_url);
        for source in self.sources.values_mut() {
            *source = source.redacted();
        }
        if let Some(awareness) = self.ingest.awareness.as_mut() {
            *awareness = awareness.redacted();
        }
        self.otel = self.otel.redacted();
        self
    }

    /// The database URL in force: the configured one, else SQLite at
    /// `<data-dir>/outboxd.db`.
    pub fn effective_database_url(&self) -> String {
        match &self.database_url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}", self.data_dir.join("outboxd.db").display()),
        }
    }
}

/// Default `console.session-ttl`: a working day.
pub const DEFAULT_SESSION_TTL: std::time::Duration = std::time::Duration::from_secs(12 * 3600);

/// `[console]`: the operator console (`crate::console`) — whether
/// `outboxd run` serves it, where, and how.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ConsoleConfig {
    /// Serve the console. Default on; it answers only after a login with
    /// `admin.token`, and with no token set nobody can log in.
    pub enabled: bool,
    /// Path the console lives under, e.g. `/console` (the default): starts
    /// with `/`, no trailing `/`, letters, digits, `-`, `_`, `/` only.
    pub prefix: String,
    /// Show everything, change nothing: every action is hidden and refused.
    pub read_only: bool,
    /// How long a login lasts ("12h", "30m"). Default 12 h.
    #[serde(with = "humantime_serde")]
    pub session_ttl: std::time::Duration,
    /// Link from an event's page to its trace in the operator's trace UI:
    /// a URL with `{trace_id}` (32 lower-case hex digits, from the event's
    /// `traceparent`), e.g. `http://jaeger:16686/trace/{trace_id}` or
    /// Tempo's explore URL. Unset: the trace id is shown without a link.
    pub trace_url: Option<String>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: true,
            prefix: "/console".into(),
            read_only: false,
            session_ttl: DEFAULT_SESSION_TTL,
            trace_url: None,
        }
    }
}

impl ConsoleConfig {
    /// Check the values; `Err((key, problem))` names the key under
    /// `console.`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let p = &self.prefix;
        let well_formed = p.len() > 1
            && p.starts_with('/')
            && !p.ends_with('/')
            && !p.contains("//")
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_'));
        if !well_formed {
            return Err((
                "prefix".into(),
                format!(
                    "{p:?} is not a path such as \"/console\" (starts with /, no trailing /, letters, digits, -, _)"
                ),
            ));
        }
        if ["/v1", "/health", "/ready", "/metrics", "/ingest"]
            .iter()
            .any(|taken| p == taken || p.starts_with(&format!("{taken}/")))
        {
            return Err((
                "prefix".into(),
                format!("{p:?} is a path of the daemon's own API; pick another, e.g. \"/console\""),
            ));
        }
        if self.session_ttl.is_zero() {
            return Err(("session-ttl".into(), "must be greater than 0".into()));
        }
        if let Some(url) = &self.trace_url {
            if !(url.starts_with("http://") || url.starts_with("https://"))
                || !url.contains("{trace_id}")
            {
                return Err((
                    "trace-url".into(),
                    format!(
                        "{url:?} is not an http(s) URL with {{trace_id}}, e.g. \"http://jaeger:16686/trace/{{trace_id}}\""
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod console_tests {
    use super::*;
    use std::time::Duration;

    fn with_prefix(prefix: &str) -> Result<(), (String, String)> {
        ConsoleConfig {
            prefix: prefix.into(),
            ..ConsoleConfig::default()
        }
        .validate()
    }

    #[test]
    fn a_prefix_is_a_plain_path_apart_from_the_api() {
        assert!(with_prefix("/console").is_ok());
        assert!(with_prefix("/ops/console-2").is_ok());
        for bad in [
            "",
            "/",
            "console",
            "/console/",
            "/a//b",
            "/v1",
            "/v1/console",
            "/metrics",
            "/c?x",
        ] {
            let (key, _) = with_prefix(bad).unwrap_err();
            assert_eq!(key, "prefix", "{bad:?}");
        }
        let zero = ConsoleConfig {
            session_ttl: Duration::ZERO,
            ..ConsoleConfig::default()
        };
        assert_eq!(zero.validate().unwrap_err().0, "session-ttl");
    }
}
