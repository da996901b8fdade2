//! The keys of a `[sources.NAME] kind = "couchdb"` table, their defaults
//! and units.
//!
//! Must never: hold a secret. Credentials are named here by the
//! environment variables that hold them and read once at start
//! ([`CouchdbConfig::credentials`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A CouchDB database whose documents keep their own outbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CouchdbConfig {
    /// Server URL, `http://host:5984` or `https://…`, without credentials.
    pub url: String,
    /// Database name.
    pub database: String,
    /// Environment variable holding the user name (basic auth). Unset: no
    /// authentication.
    #[serde(default)]
    pub username_env: Option<String>,
    /// Environment variable holding the password. Required with
    /// `username-env`. The value is never logged.
    #[serde(default)]
    pub password_env: Option<String>,
    /// Design document the `pending` view lives in (`_design/<name>`).
    /// Installed at start when missing or outdated. Default `outboxd`.
    #[serde(default = "default_design")]
    pub design_document: String,
    /// How often the whole pending view is read again, so an entry is found
    /// even when the change feed skipped it. Default 30 s.
    #[serde(default = "default_scan_interval", with = "humantime_serde")]
    pub scan_interval: Duration,
    /// `timeout` of each `_changes?feed=longpoll` request: how long the
    /// server may hold it open when nothing changes. Default 25 s.
    #[serde(default = "default_feed_timeout", with = "humantime_serde")]
    pub feed_timeout: Duration,
    /// Timeout of every other request to CouchDB. Default 10 s.
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Rows per view page and changes per feed request. Default 200.
    #[serde(default = "default_page_size")]
    pub page_size: u32,
    /// CloudEvents `source` of the events. Default `/couchdb/<database>`.
    #[serde(default)]
    pub event_source: Option<String>,
    /// CloudEvents `type`: a template over the entry's fields, `{name}`
    /// replaced by the field's value (`{routing_key}` →
    /// `documents.new.person`). Default `{routing_key}`.
    #[serde(default = "default_type")]
    pub event_type: String,
    /// Where the entries live in a document and what their fields are named.
    #[serde(default)]
    pub paths: EntryPaths,
}

/// Field paths of the entry shape. `entries` is a dotted path from the
/// document's root; the others are field names inside one entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct EntryPaths {
    /// Default `extensions._server_outbox`.
    pub entries: String,
    /// Default `event_id`.
    pub event_id: String,
    /// Default `sequence`.
    pub sequence: String,
    /// Default `status`.
    pub status: String,
    /// Default `routing_key`.
    pub routing_key: String,
    /// Default `operation`.
    pub operation: String,
    /// Default `payload`.
    pub payload: String,
    /// Default `created_at` (RFC 3339; becomes the event's `time`).
    pub created_at: String,
    /// Default `published_at`.
    pub published_at: String,
    /// The status of an entry waiting to be published. Default `pending`.
    pub pending: String,
    /// The status of an entry already published. Default `published`.
    pub published: String,
    /// The W3C `traceparent` of the transaction that wrote the entry (the
    /// event's creation context, stored as the CloudEvents `traceparent`
    /// extension; absent or malformed: none). Default `traceparent`.
    pub traceparent: String,
}

impl Default for EntryPaths {
    fn default() -> Self {
        EntryPaths {
            entries: "extensions._server_outbox".into(),
            event_id: "event_id".into(),
            sequence: "sequence".into(),
            status: "status".into(),
            routing_key: "routing_key".into(),
            operation: "operation".into(),
            payload: "payload".into(),
            created_at: "created_at".into(),
            published_at: "published_at".into(),
            pending: "pending".into(),
            published: "published".into(),
            traceparent: "traceparent".into(),
        }
    }
}

fn default_design() -> String {
    "outboxd".into()
}
fn default_scan_interval() -> Duration {
    Duration::from_secs(30)
}
fn default_feed_timeout() -> Duration {
    Duration::from_secs(25)
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_page_size() -> u32 {
    200
}
fn default_type() -> String {
    "{routing_key}".into()
}

/// Basic-auth credentials read from the environment. `Debug` hides the
/// password.
#[derive(Clone)]
pub struct Credentials {
    /// The user name, from `username-env`.
    pub username: String,
    /// The password, from `password-env`; never logged.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({:?}, ***)", self.username)
    }
}

impl CouchdbConfig {
    /// Check the values. `Err((key, problem))`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, problem: String| Err((key.to_string(), problem));
        let url = match reqwest::Url::parse(&self.url) {
            Ok(u) => u,
            Err(e) => return bad("url", format!("{:?} is not a URL: {e}", self.url)),
        };
        if url.scheme() != "http" && url.scheme() != "https" {
            return bad(
                "url",
                format!("scheme must be http or https, got {:?}", url.scheme()),
            );
        }
        if !url.username().is_empty() || url.password().is_some() {
            return bad(
                "url",
                "must not carry credentials: name their environment variables in username-env and password-env".into(),
            );
        }
        if self.database.is_empty() || self.database.starts_with('_') {
            return bad(
                "database",
                format!("{:?} is not a database name", self.database),
            );
        }
        if self.username_env.is_some() != self.password_env.is_some() {
            return bad(
                "password-env",
                "username-env and password-env are given together or not at all".into(),
            );
        }
        if self.design_document.is_empty() || self.design_document.contains('/') {
            return bad(
                "design-document",
                format!("{:?} is not a design document name", self.design_document),
            );
        }
        for (key, d) in [
            ("scan-interval", self.scan_interval),
            ("feed-timeout", self.feed_timeout),
            ("request-timeout", self.request_timeout),
        ] {
            if d.is_zero() {
                return bad(key, "must be greater than 0s".into());
            }
        }
        if self.page_size == 0 || self.page_size > 10_000 {
            return bad(
                "page-size",
                format!("{} is not within 1..=10000", self.page_size),
            );
        }
        let p = &self.paths;
        for (key, v) in [
            ("paths.entries", &p.entries),
            ("paths.event-id", &p.event_id),
            ("paths.sequence", &p.sequence),
            ("paths.status", &p.status),
            ("paths.routing-key", &p.routing_key),
            ("paths.operation", &p.operation),
            ("paths.payload", &p.payload),
            ("paths.created-at", &p.created_at),
            ("paths.published-at", &p.published_at),
            ("paths.pending", &p.pending),
            ("paths.published", &p.published),
        ] {
            if v.is_empty() || v.split('.').any(str::is_empty) {
                return bad(key, format!("{v:?} is not a field path"));
            }
        }
        if p.pending == p.published {
            return bad("paths.published", "must differ from paths.pending".into());
        }
        if let Err(e) = crate::sources::template::Template::parse(&self.event_type) {
            return bad("event-type", e);
        }
        Ok(())
    }

    /// The credentials named by `username-env` and `password-env`, read from
    /// the environment now. Errors name the variable that is unset.
    pub fn credentials(&self) -> Result<Option<Credentials>, String> {
        let (Some(user), Some(pass)) = (&self.username_env, &self.password_env) else {
            return Ok(None);
        };
        let read = |key: &str, var: &str| {
            std::env::var(var).map_err(|_| format!("{key}: environment variable {var} is not set"))
        };
        Ok(Some(Credentials {
            username: read("username-env", user)?,
            password: read("password-env", pass)?,
        }))
    }

    /// The CloudEvents `source` in force.
    pub fn effective_event_source(&self) -> String {
        self.event_source
            .clone()
            .unwrap_or_else(|| format!("/couchdb/{}", self.database))
    }
}
