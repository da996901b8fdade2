//! The `[sources.NAME] kind = "neo4j"` settings: the outbox node's label
//! and property names, how a node becomes an event, the claim, retry and
//! retention knobs, and their validation (every name a plain identifier,
//! every duration inside the bounds the relay needs).
//!
//! Must never: read the environment (the password variable is read when
//! the relay starts, [`super::relay`]) or talk to Neo4j.

use super::*;

/// Property names of the outbox node. Each must be a plain identifier
/// (letters, digits, `_`, not starting with a digit).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct PropertyNames {
    /// Event id (CloudEvents `id`). Default `eventId`.
    pub event_id: String,
    /// Stream key. Default `packetId`.
    pub stream: String,
    /// Position in the stream, an integer from 1. Default `streamVersion`.
    pub stream_version: String,
    /// Default `status`.
    pub status: String,
    /// Attempts counted at claim. Default `attempts`.
    pub attempts: String,
    /// When a failed node is due again (datetime). Default `nextAttemptAt`.
    pub next_attempt_at: String,
    /// Creation time (datetime); becomes the event's `time`. Default
    /// `createdAt`.
    pub created_at: String,
    /// Lease token of the claim in force. Default `leaseToken`.
    pub lease_token: String,
    /// Lease expiry (datetime, database clock). Default `leaseExpiresAt`.
    pub lease_expires_at: String,
    /// Last failure reason. Default `lastError`.
    pub last_error: String,
    /// When it was stored in outboxd (datetime). Default `deliveredAt`.
    pub delivered_at: String,
}

impl Default for PropertyNames {
    fn default() -> Self {
        PropertyNames {
            event_id: "eventId".into(),
            stream: "packetId".into(),
            stream_version: "streamVersion".into(),
            status: "status".into(),
            attempts: "attempts".into(),
            next_attempt_at: "nextAttemptAt".into(),
            created_at: "createdAt".into(),
            lease_token: "leaseToken".into(),
            lease_expires_at: "leaseExpiresAt".into(),
            last_error: "lastError".into(),
            delivered_at: "deliveredAt".into(),
        }
    }
}

/// How the data of the outbox node is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    /// The data property holds JSON text (`datacontenttype` `application/json`).
    Json,
    /// The data property holds plain text (`text/plain`).
    Text,
}

/// How an outbox node becomes a CloudEvent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct EventMapping {
    /// Property holding the CloudEvents `type`. Default `eventType`.
    pub type_property: String,
    /// CloudEvents `source` of every event. Default `outboxd:neo4j/NAME`.
    pub source: Option<String>,
    /// Property holding the source instead (wins when present).
    pub source_property: Option<String>,
    /// Property holding the `subject`, if any.
    pub subject_property: Option<String>,
    /// Property holding the data. Default `payload`.
    pub data_property: String,
    /// `json` (default) or `text`.
    pub data_format: DataFormat,
    /// Properties left out of the event. Every other property that is not
    /// one of the relay's own becomes an extension attribute named by
    /// lower-casing it and dropping characters other than letters and
    /// digits (`tenantId` → `tenantid`).
    pub ignore_properties: Vec<String>,
}

impl Default for EventMapping {
    fn default() -> Self {
        EventMapping {
            type_property: "eventType".into(),
            source: None,
            source_property: None,
            subject_property: None,
            data_property: "payload".into(),
            data_format: DataFormat::Json,
            ignore_properties: Vec::new(),
        }
    }
}

/// `[sources.NAME]` with `kind = "neo4j"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Neo4jSourceConfig {
    /// Bolt URL, `bolt://host:7687` (or `neo4j://`, `bolt+s://`,
    /// `neo4j+s://`). Required.
    pub url: String,
    /// User name. Default `neo4j`.
    pub user: String,
    /// Name of the environment variable holding the password (read at
    /// start, never logged). Unset: empty password (auth disabled).
    pub password_env: Option<String>,
    /// Database name. Default: the server's default database.
    pub database: Option<String>,
    /// Label of the outbox nodes. Default `AwarenessOutbox`.
    pub label: String,
    /// Property names of the outbox node.
    pub properties: PropertyNames,
    /// How a node becomes an event.
    pub event: EventMapping,
    /// Most nodes claimed (and ingested in one store transaction) per
    /// cycle. Default 100.
    pub batch_size: u32,
    /// Nodes read per shortlist page. Default 200.
    pub page_size: u32,
    /// Most shortlist pages read per lane per cycle (bounds a cycle's cost
    /// whatever the backlog; the next cycle goes on from where this one
    /// stopped). Default 10.
    pub max_pages: u32,
    /// Lease on claimed nodes (database clock). Default 60 s.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// Pause after a cycle that claimed nothing. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// First retry delay of a node whose relay failed; doubles per attempt
    /// up to `retry-cap`, with jitter. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub retry_base: Duration,
    /// Longest retry delay. Default 5 min.
    #[serde(with = "humantime_serde")]
    pub retry_cap: Duration,
    /// Delivered nodes older than this are deleted. Default 7 days.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Nodes deleted per retention batch. Default 1000.
    pub retention_batch: u32,
    /// Timeout of each Neo4j call. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for Neo4jSourceConfig {
    fn default() -> Self {
        Neo4jSourceConfig {
            url: String::new(),
            user: "neo4j".into(),
            password_env: None,
            database: None,
            label: "AwarenessOutbox".into(),
            properties: PropertyNames::default(),
            event: EventMapping::default(),
            batch_size: 100,
            page_size: 200,
            max_pages: 10,
            lease: Duration::from_secs(60),
            poll_interval: Duration::from_secs(1),
            retry_base: Duration::from_secs(1),
            retry_cap: Duration::from_secs(300),
            retention: Duration::from_secs(7 * 24 * 3600),
            retention_batch: 1000,
            timeout: Duration::from_secs(10),
        }
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Neo4jSourceConfig {
    /// Check the values. `Err((key, problem))`, the key relative to
    /// `sources.NAME.`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        self.validate_connection()?;
        self.validate_properties()?;
        self.validate_limits()
    }

    /// `url` (a Bolt URL), `label` and `password-env`.
    fn validate_connection(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, problem: String| Err((key.to_string(), problem));
        if self.url.is_empty() {
            return bad("url", "is required (e.g. \"bolt://127.0.0.1:7687\")".into());
        }
        let schemes = [
            "bolt://",
            "bolt+s://",
            "bolt+ssc://",
            "neo4j://",
            "neo4j+s://",
            "neo4j+ssc://",
        ];
        if !schemes.iter().any(|s| self.url.starts_with(s)) {
            return bad(
                "url",
                format!(
                    "{:?} is not a Bolt URL (expected bolt://HOST:PORT or neo4j://HOST:PORT)",
                    self.url
                ),
            );
        }
        if !is_identifier(&self.label) {
            return bad(
                "label",
                format!(
                    "{:?} is not a plain identifier (letters, digits, _)",
                    self.label
                ),
            );
        }
        if let Some(env) = &self.password_env {
            if env.is_empty() {
                return bad("password-env", "names no environment variable".into());
            }
        }
        Ok(())
    }

    /// The property names: plain identifiers, none used twice.
    fn validate_properties(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, problem: String| Err((key.to_string(), problem));
        let p = &self.properties;
        let props = [
            ("properties.event-id", &p.event_id),
            ("properties.stream", &p.stream),
            ("properties.stream-version", &p.stream_version),
            ("properties.status", &p.status),
            ("properties.attempts", &p.attempts),
            ("properties.next-attempt-at", &p.next_attempt_at),
            ("properties.created-at", &p.created_at),
            ("properties.lease-token", &p.lease_token),
            ("properties.lease-expires-at", &p.lease_expires_at),
            ("properties.last-error", &p.last_error),
            ("properties.delivered-at", &p.delivered_at),
            ("event.type-property", &self.event.type_property),
            ("event.data-property", &self.event.data_property),
        ];
        let mut seen = HashSet::new();
        for (key, value) in props {
            if !is_identifier(value) {
                return bad(
                    key,
                    format!("{value:?} is not a plain identifier (letters, digits, _)"),
                );
            }
            if !seen.insert(value.as_str()) {
                return bad(
                    key,
                    format!("{value:?} is already used by another property"),
                );
            }
        }
        for (key, value) in [
            ("event.source-property", &self.event.source_property),
            ("event.subject-property", &self.event.subject_property),
        ] {
            if let Some(v) = value {
                if !is_identifier(v) {
                    return bad(
                        key,
                        format!("{v:?} is not a plain identifier (letters, digits, _)"),
                    );
                }
            }
        }
        Ok(())
    }

    /// Sizes, durations and how they bound each other.
    fn validate_limits(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, problem: String| Err((key.to_string(), problem));
        for (key, n) in [
            ("batch-size", self.batch_size),
            ("page-size", self.page_size),
            ("max-pages", self.max_pages),
            ("retention-batch", self.retention_batch),
        ] {
            if n == 0 {
                return bad(key, "must be greater than 0".into());
            }
        }
        for (key, d) in [
            ("lease", self.lease),
            ("poll-interval", self.poll_interval),
            ("retry-base", self.retry_base),
            ("timeout", self.timeout),
        ] {
            if d.is_zero() {
                return bad(key, "must be greater than 0s".into());
            }
        }
        if self.retry_cap < self.retry_base {
            return bad("retry-cap", "must not be shorter than retry-base".into());
        }
        if self.lease <= self.timeout * 2 {
            return bad(
                "lease",
                format!(
                    "{} must be longer than twice the timeout ({}), so a claim outlives its ingest",
                    humantime::format_duration(self.lease),
                    humantime::format_duration(self.timeout)
                ),
            );
        }
        Ok(())
    }
}
