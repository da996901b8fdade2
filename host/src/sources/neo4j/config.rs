//! The `[sources.NAME] kind = "neo4j"` settings: the outbox node's label
//! and property names, the owner's words for each state and the encoding of
//! its times, how a node becomes an event, the claim, retry and retention
//! knobs, and their validation (every name a plain identifier, every state
//! word its own, every duration inside the bounds the relay needs).
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
    /// When a failed node is due again (in `time-encoding`). Default
    /// `nextAttemptAt`.
    pub next_attempt_at: String,
    /// Creation time (in `time-encoding`); the event's `time` unless
    /// `event.time-property` names another. Default `createdAt`.
    pub created_at: String,
    /// Lease token of the claim in force. Default `leaseToken`.
    pub lease_token: String,
    /// Lease expiry (in `time-encoding`, database clock). Default
    /// `leaseExpiresAt`.
    pub lease_expires_at: String,
    /// Who holds the lease, written at claim (`outboxd-HOST-PID`) and
    /// removed at finish, when the owner keeps one (the vault's
    /// `leaseOwner`). Default: none.
    pub lease_owner: Option<String>,
    /// Written and removed again at the start of a claim, only to take the
    /// node's write lock before its state is re-read; never read. The
    /// owner's own probe property when it has one (the vault's
    /// `claimProbe`). Default `outboxdClaimLock`.
    pub lock: String,
    /// Last failure reason. Default `lastError`.
    pub last_error: String,
    /// When it was marked delivered (in `time-encoding`): stored in outboxd,
    /// or acknowledged by every destination with `delivered-when =
    /// "acknowledged"`. The vault's word is `acknowledgedAt`. Default
    /// `deliveredAt`.
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
            lease_owner: None,
            lock: "outboxdClaimLock".into(),
            last_error: "lastError".into(),
            delivered_at: "deliveredAt".into(),
        }
    }
}

/// The owner's word for each state of an outbox node, read and written as
/// they are: the relay shortlists by them, blocks a stream on the live ones
/// (waiting, failed, in flight) and writes them back, so the owner's own
/// dispatcher, tools and retention keep understanding the outbox. Each a
/// plain word (letters, digits, `_`, `-`, `.`, `:`), no two alike.
///
/// Written out, the table names every state the owner has; `dead` left out
/// means the owner has no dead state: a node the relay refuses (not an
/// event, or its id stored with other content) is then written `failed`
/// with the reason in `last-error`, due again after `retry-cap` — it keeps
/// blocking its stream, as under a dispatcher that retries for ever, until
/// someone repairs or removes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct StatusWords {
    /// Waiting for its first relay. Default `pending`.
    #[serde(default = "StatusWords::default_pending")]
    pub pending: String,
    /// Claimed under a lease. Default `inflight` (the vault: `delivering`).
    #[serde(default = "StatusWords::default_in_flight")]
    pub in_flight: String,
    /// Failed, due again at `next-attempt-at`. Default `failed`.
    #[serde(default = "StatusWords::default_failed")]
    pub failed: String,
    /// Done. Default `delivered`.
    #[serde(default = "StatusWords::default_delivered")]
    pub delivered: String,
    /// Refused for good, if the owner has such a state. Default `dead`
    /// when the table is not written; none when it is and leaves it out.
    #[serde(default)]
    pub dead: Option<String>,
}

impl StatusWords {
    fn default_pending() -> String {
        "pending".into()
    }
    fn default_in_flight() -> String {
        "inflight".into()
    }
    fn default_failed() -> String {
        "failed".into()
    }
    fn default_delivered() -> String {
        "delivered".into()
    }

    /// The words that block later versions of a stream: waiting, failed,
    /// in flight.
    pub fn live(&self) -> [&str; 3] {
        [&self.pending, &self.failed, &self.in_flight]
    }
}

impl Default for StatusWords {
    fn default() -> Self {
        StatusWords {
            pending: Self::default_pending(),
            in_flight: Self::default_in_flight(),
            failed: Self::default_failed(),
            delivered: Self::default_delivered(),
            dead: Some("dead".into()),
        }
    }
}

/// How a time property is stored on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimeEncoding {
    /// A Neo4j `DATETIME` (`datetime()`).
    Datetime,
    /// Unix epoch milliseconds as an `INTEGER` (Java's
    /// `System.currentTimeMillis()`); a `FLOAT` is read too.
    EpochMillis,
    /// Unix epoch milliseconds as a `FLOAT`: what the JavaScript driver
    /// stores for `Date.now()` (a JavaScript number); an `INTEGER` is read
    /// too.
    EpochMillisFloat,
    /// ISO-8601 text (`new Date().toISOString()`). Only for the event's
    /// time (`event.time-encoding`): the relay never compares text times.
    Iso8601,
}

/// When the relay marks a node delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveredWhen {
    /// Once its event is stored in outboxd (outboxd's sinks deliver it
    /// from there). The node's lease ends at once.
    Stored,
    /// Once every destination of its event acknowledged it (or it was
    /// dead-lettered: the node is then marked as refused). The node stays
    /// in flight under a lease the relay renews until then, so the next
    /// node of its stream is not taken — by this relay or by a dispatcher
    /// of the owner's running beside it — before the target has this one.
    /// For taking over a live outbox (docs/takeover.md).
    Acknowledged,
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
    /// The CloudEvents `type` from a template over the node's properties
    /// (`org.example.packet.{operation}`: each `{name}` a property holding
    /// a string or number) or a constant. Wins over `type-property`.
    #[serde(rename = "type")]
    pub type_template: Option<String>,
    /// Property holding the CloudEvents `type`, when `type` is not set.
    /// Default `eventType`.
    pub type_property: String,
    /// Property holding the event's `time`. Default: `properties.created-at`.
    pub time_property: Option<String>,
    /// Encoding of `time-property`. Default: the source's `time-encoding`.
    pub time_encoding: Option<TimeEncoding>,
    /// The properties that become extension attributes, and no others.
    /// Unset: every property not denied (the relay's own, the lock and
    /// lease properties, `ignore-properties`).
    pub extensions: Option<Vec<String>>,
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
    /// Properties left out of the event, beside the ones always left out:
    /// every property the relay reads or writes (the `properties` table,
    /// the data, type, time, source and subject properties, the lock
    /// property) and `properties.lease-owner`. Every other property becomes
    /// an extension attribute named by lower-casing it and dropping
    /// characters other than letters and digits (`tenantId` → `tenantid`),
    /// unless `extensions` lists which may.
    pub ignore_properties: Vec<String>,
    /// Property holding the W3C `traceparent` of the transaction that
    /// wrote the node (the event's creation context, stored as the
    /// CloudEvents `traceparent` extension; a malformed value is left
    /// out). Default `traceparent`.
    pub traceparent_property: String,
}

impl Default for EventMapping {
    fn default() -> Self {
        EventMapping {
            type_template: None,
            type_property: "eventType".into(),
            time_property: None,
            time_encoding: None,
            extensions: None,
            source: None,
            source_property: None,
            subject_property: None,
            data_property: "payload".into(),
            data_format: DataFormat::Json,
            ignore_properties: Vec::new(),
            traceparent_property: "traceparent".into(),
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
    /// The owner's word for each state (`[sources.NAME.statuses]`).
    pub statuses: StatusWords,
    /// How the relay's time properties (created-at, next-attempt-at,
    /// lease-expires-at, delivered-at) are stored: `datetime` (default),
    /// `epoch-millis` or `epoch-millis-float`.
    pub time_encoding: TimeEncoding,
    /// `stored` (default) or `acknowledged`: see [`DeliveredWhen`].
    pub delivered_when: DeliveredWhen,
    /// How long a node in flight whose lease expiry cannot be read
    /// (missing, or not in `time-encoding`) is left to the lease holder
    /// before it is reclaimed (counted and logged). Default 10 min.
    #[serde(with = "humantime_serde")]
    pub unreadable_lease_wait: Duration,
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
            statuses: StatusWords::default(),
            time_encoding: TimeEncoding::Datetime,
            delivered_when: DeliveredWhen::Stored,
            unreadable_lease_wait: Duration::from_secs(600),
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
        self.validate_vocabulary()?;
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
            ("properties.lock", &p.lock),
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
        if let Some(owner) = &p.lease_owner {
            if !seen.insert(owner.as_str()) {
                return bad(
                    "properties.lease-owner",
                    format!("{owner:?} is already used by another property"),
                );
            }
        }
        for (key, value) in [
            ("event.source-property", &self.event.source_property),
            ("event.subject-property", &self.event.subject_property),
            ("event.time-property", &self.event.time_property),
            ("properties.lease-owner", &p.lease_owner),
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
        if let Some(allowed) = &self.event.extensions {
            let relay_own = super::queries::own_properties(self);
            for name in allowed {
                if !is_identifier(name) {
                    return bad(
                        "event.extensions",
                        format!("{name:?} is not a plain identifier (letters, digits, _)"),
                    );
                }
                if relay_own.contains(name) {
                    return bad(
                        "event.extensions",
                        format!("{name:?} is a property the relay reads or writes itself"),
                    );
                }
            }
        }
        Ok(())
    }

    /// The state words (each a plain word, no two alike), the time
    /// encodings (text only for the event's time) and the type template.
    fn validate_vocabulary(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, problem: String| Err((key.to_string(), problem));
        let s = &self.statuses;
        let mut words: Vec<(&str, &str)> = vec![
            ("statuses.pending", &s.pending),
            ("statuses.in-flight", &s.in_flight),
            ("statuses.failed", &s.failed),
            ("statuses.delivered", &s.delivered),
        ];
        if let Some(dead) = &s.dead {
            words.push(("statuses.dead", dead));
        }
        for (i, (key, word)) in words.iter().enumerate() {
            let plain = |c: char| c.is_ascii_alphanumeric() || "_-.:".contains(c);
            if word.is_empty() || !word.chars().all(plain) {
                return bad(
                    key,
                    format!("{word:?} is not a plain word (letters, digits, _ - . :)"),
                );
            }
            if let Some((other, _)) = words[..i].iter().find(|(_, w)| w == word) {
                return bad(key, format!("{word:?} is already the word of {other}"));
            }
        }
        if self.time_encoding == TimeEncoding::Iso8601 {
            return bad(
                "time-encoding",
                "iso8601 is only for event.time-encoding: the relay compares and writes its own times (use datetime, epoch-millis or epoch-millis-float)".into(),
            );
        }
        if let Some(template) = &self.event.type_template {
            if let Err(e) = crate::sources::template::Template::parse(template) {
                return bad("event.type", e);
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
