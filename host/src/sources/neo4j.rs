//! The Neo4j outbox relay (`[sources.NAME] kind = "neo4j"`).
//!
//! Applications write an outbox node (label `AwarenessOutbox` by default)
//! in the same transaction as each mutation: `eventId`, `packetId` (the
//! stream), `streamVersion` (its gapless position, from a per-stream
//! counter node), `status = 'pending'`, `attempts`, `nextAttemptAt`,
//! `createdAt`, the event's type and a JSON payload. This relay claims
//! those nodes, ingests each into outboxd's store (event id = `eventId`,
//! producer sequence = `streamVersion`) and finishes it fenced by its lease
//! token.
//!
//! Owns: the lock-first claim, safe with any number of relays and replicas.
//! Neo4j locks a node only when a transaction writes it, after a filter has
//! read it, so a filter-then-set claim lets concurrent relays claim the same
//! node. The claim therefore:
//!
//! 1. shortlists read-only the heads of streams (no earlier version of the
//!    stream pending, failed or in flight): the next heads of the streams
//!    it just finished, then per lane (pending; failed and due; in flight
//!    with an expired lease), keyset-paged on the `(status, eventId)` index
//!    (never `SKIP`), then, when the lanes meet nodes behind their heads,
//!    stream by stream over the `(stream, status, version)` index;
//! 2. in one write transaction over at most `batch-size` shortlisted nodes,
//!    first writes a throwaway property on each (taking its write lock),
//!    then re-checks eligibility and the predecessors, then sets `status =
//!    'inflight'`, a fresh lease token, the lease expiry (database clock)
//!    and counts the attempt.
//!
//! Every finish matches `{eventId, leaseToken}`: a relay whose lease was
//! taken over changes nothing (counted as `lease_lost`). Statuses:
//! `pending`, `inflight`, `delivered`, `failed` (retried at
//! `nextAttemptAt`), `dead` (refused for good: bad node or conflicting
//! content; the reason is in `lastError`). Delivered nodes older than the
//! retention are deleted in bounded batches.
//!
//! Must never: set a node's status without holding its lock and having
//! re-read it, ingest version n+1 of a stream before version n, run a query
//! that is not index-backed (the indexes are created at start) or that
//! sorts what an index could give in order, or log the password.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use neo4rs::{query, Graph, Query};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::watch;

use super::{SourceContext, StatusHandle};
use crate::backoff::Backoff;
use crate::event::NewEvent;
use crate::store::IngestError;

/// Status of a node waiting for its first relay.
pub const PENDING: &str = "pending";
/// Status of a claimed node (lease token and expiry set).
pub const INFLIGHT: &str = "inflight";
/// Status of a node stored in outboxd (with `deliveredAt`).
pub const DELIVERED: &str = "delivered";
/// Status of a node whose relay failed; tried again at `nextAttemptAt`.
pub const FAILED: &str = "failed";
/// Status of a node refused for good (`lastError` says why).
pub const DEAD: &str = "dead";
/// Statuses that block later versions of the same stream.
pub const LIVE: [&str; 3] = [PENDING, FAILED, INFLIGHT];

/// Property written and removed again at the start of a claim, only to
/// take the node's write lock before eligibility is re-read.
pub const LOCK_PROPERTY: &str = "outboxdClaimLock";

/// Most rounds of retention deletes in one cycle.
const RETENTION_ROUNDS: u32 = 10;
/// How often retention runs (more often when the retention is shorter).
const RETENTION_EVERY: Duration = Duration::from_secs(10);
/// How often nodes without a usable event id are looked for.
const MISSING_ID_EVERY: Duration = Duration::from_secs(30);
/// Most such nodes marked dead per sweep.
const MISSING_ID_BATCH: i64 = 100;
/// How often the oldest pending age is measured.
const OLDEST_EVERY: Duration = Duration::from_secs(5);
/// Most times a claim transaction is retried on a transient error
/// (deadlock, lock timeout): explicit transactions are not retried by the
/// driver.
const CLAIM_RETRIES: u32 = 5;

/// Streams found per walk query ([`Queries::walk`]): one index seek each,
/// 16 in one round trip (about 7 ms at 200,000 nodes, 2026-12-03).
const WALK_STEPS: usize = 16;

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

/// A Neo4j failure of the relay.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The driver or the server failed.
    #[error("neo4j {what}: {source}")]
    Neo4j {
        /// The step that failed (`claim`, `finish`, `indexes`, ...).
        what: &'static str,
        /// The driver's error.
        #[source]
        source: neo4rs::Error,
    },
    /// No answer within the configured timeout.
    #[error("neo4j {what}: no answer within {timeout:?}")]
    Timeout {
        /// The step that timed out.
        what: &'static str,
        /// The timeout that passed.
        timeout: Duration,
    },
    /// outboxd's own store failed while ingesting a claimed batch (the
    /// nodes were marked failed, to retry).
    #[error("ingest into the outboxd store: {0}")]
    Ingest(String),
    /// A setting that can only be read at run time is unusable (the
    /// message names the key).
    #[error("configuration: {0}")]
    Config(String),
    /// A row of an answer did not have the expected shape.
    #[error("neo4j {what}: unexpected answer: {detail}")]
    Shape {
        /// The step whose answer it was.
        what: &'static str,
        /// What was wrong with the row.
        detail: String,
    },
}

impl OutboxError {
    /// True when the server answered (so it is reachable).
    pub fn connected(&self) -> bool {
        matches!(
            self,
            OutboxError::Neo4j {
                source: neo4rs::Error::Neo4j(_),
                ..
            } | OutboxError::Shape { .. }
                | OutboxError::Ingest(_)
        )
    }

    fn transient(&self) -> bool {
        matches!(self, OutboxError::Neo4j { source: neo4rs::Error::Neo4j(e), .. }
            if e.kind() == neo4rs::Neo4jErrorKind::Transient)
    }
}

/// A node claimed by [`Outbox::claim`], with what the event is made of.
#[derive(Debug, Clone)]
pub struct ClaimedNode {
    /// The node's event id property (becomes the event's `id`).
    pub event_id: String,
    /// The claim's fencing token.
    pub lease_token: String,
    /// Attempts including this one.
    pub attempts: i64,
    /// The stream property when it is a string.
    pub stream: Option<String>,
    /// The stream property as text, whatever its type (for reasons).
    pub stream_text: Option<String>,
    /// The version property when it is an integer.
    pub version: Option<i64>,
    /// The version property as text, whatever its type (for reasons).
    pub version_text: Option<String>,
    /// The type property (CloudEvents `type`) when it is a string.
    pub ty: Option<String>,
    /// The source property (CloudEvents `source`) when it is a string.
    pub source: Option<String>,
    /// The subject property (CloudEvents `subject`) when it is a string.
    pub subject: Option<String>,
    /// The created-at property as RFC 3339 text (CloudEvents `time`).
    pub time: Option<String>,
    /// The data property when it is a string.
    pub data: Option<String>,
    /// The data property is set (of any type).
    pub has_data: bool,
    /// Other properties as (name, value as text; `None` when not
    /// representable).
    pub extensions: Vec<(String, Option<String>)>,
}

/// The queries of the relay, built once for a label and property names.
#[derive(Debug, Clone)]
pub struct Queries {
    /// `CREATE INDEX … IF NOT EXISTS`, one per index the queries seek.
    pub indexes: Vec<String>,
    /// One per lane: `$after` cursor, `$page` size.
    pub shortlist: [(&'static str, String); 3],
    /// The head of each of `$streams` (string stream values): its live node
    /// of the least version, one seek of the `(stream, status, version)`
    /// index per live status, and whether it is due. Asked for the streams
    /// whose head this relay just finished, so their next node is found
    /// without paging the lanes (see [`Outbox::shortlist`]).
    pub successors: String,
    /// The next 16 stream values after `$after` (string), in
    /// order, one index seek each: the streams the walk asks
    /// [`Queries::successors`] about next (see [`Outbox::shortlist`]).
    pub walk: String,
    /// Takes the shortlisted nodes (`$ids`) still eligible and at their
    /// stream's head: `inflight` under `$token` for `$lease_ms`, attempts + 1.
    pub claim: String,
    /// Marks a claimed node delivered, when its lease token still matches.
    pub finish_delivered: String,
    /// Marks a claimed node failed with its next attempt time, when its
    /// lease token still matches.
    pub finish_failed: String,
    /// Marks a claimed node dead with the reason, when its lease token
    /// still matches.
    pub finish_dead: String,
    /// Deletes up to `$limit` nodes delivered more than `$older_ms` ago.
    pub retention: String,
    /// Age of the oldest pending node by its created-at, ms (lag metric).
    pub oldest_pending: String,
    /// Marks dead the waiting nodes whose event id is missing or not a
    /// string (the shortlist, keyset-paged on the id, never sees them).
    /// Hinted to the `(status)` index: a composite index holds only nodes
    /// that have every one of its properties.
    pub missing_id: String,
}

impl Queries {
    /// Every query with a name, for plan checks.
    pub fn all(&self) -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = self
            .shortlist
            .iter()
            .map(|(lane, q)| (format!("shortlist {lane}"), q.clone()))
            .collect();
        all.extend([
            ("successors".to_string(), self.successors.clone()),
            ("walk".to_string(), self.walk.clone()),
            ("claim".to_string(), self.claim.clone()),
            (
                "finish delivered".to_string(),
                self.finish_delivered.clone(),
            ),
            ("finish failed".to_string(), self.finish_failed.clone()),
            ("finish dead".to_string(), self.finish_dead.clone()),
            ("retention".to_string(), self.retention.clone()),
            ("oldest pending".to_string(), self.oldest_pending.clone()),
            ("missing id".to_string(), self.missing_id.clone()),
        ]);
        all
    }

    /// Build the queries of `config` (already validated).
    ///
    /// Long on purpose: every query is one format string over the same
    /// backquoted label and property names, and they read best side by
    /// side (the claim and the fenced finishes must agree on status values
    /// and lease properties); split, each part would re-derive the names.
    pub fn new(config: &Neo4jSourceConfig) -> Queries {
        let l = format!("`{}`", config.label);
        let p = &config.properties;
        let q = |s: &str| format!("`{s}`");
        let (id, stream, version, status) = (
            q(&p.event_id),
            q(&p.stream),
            q(&p.stream_version),
            q(&p.status),
        );
        let (attempts, next_at, created) =
            (q(&p.attempts), q(&p.next_attempt_at), q(&p.created_at));
        let (token, expires, last_error, delivered_at) = (
            q(&p.lease_token),
            q(&p.lease_expires_at),
            q(&p.last_error),
            q(&p.delivered_at),
        );
        let live = "['pending', 'failed', 'inflight']";
        let label = &config.label;
        let indexes = vec![
            format!("CREATE INDEX `outboxd_{label}_event_id` IF NOT EXISTS FOR (n:{l}) ON (n.{id})"),
            format!("CREATE INDEX `outboxd_{label}_status` IF NOT EXISTS FOR (n:{l}) ON (n.{status})"),
            format!("CREATE INDEX `outboxd_{label}_status_event_id` IF NOT EXISTS FOR (n:{l}) ON (n.{status}, n.{id})"),
            format!("CREATE INDEX `outboxd_{label}_stream_status_version` IF NOT EXISTS FOR (n:{l}) ON (n.{stream}, n.{status}, n.{version})"),
            format!("CREATE INDEX `outboxd_{label}_status_delivered_at` IF NOT EXISTS FOR (n:{l}) ON (n.{status}, n.{delivered_at})"),
            format!("CREATE INDEX `outboxd_{label}_status_created_at` IF NOT EXISTS FOR (n:{l}) ON (n.{status}, n.{created})"),
        ];
        // No earlier version of n's stream still to relay. Seeks the
        // (stream, status, version) index once per live status.
        let no_earlier = format!(
            "NOT EXISTS {{ MATCH (e:{l}) WHERE e.{stream} = n.{stream} AND e.{status} IN {live} AND e.{version} < n.{version} }}"
        );
        // Every ORDER BY names the index's properties from the first one:
        // Neo4j 5 reads the index in order only then (ordered by the last
        // property alone, it reads every entry of the seek and sorts them,
        // which is the whole lane at each page).
        let lane = |status_value: &str, due: &str| {
            format!(
                "MATCH (n:{l}) USING INDEX n:{l}({status}, {id}) \
                 WHERE n.{status} = '{status_value}' AND n.{id} > $after \
                 WITH n ORDER BY n.{status} ASC, n.{id} ASC LIMIT $page \
                 RETURN n.{id} AS id, {due} AS due, {no_earlier} AS head"
            )
        };
        let shortlist = [
            (PENDING, lane(PENDING, "true")),
            (
                FAILED,
                lane(
                    FAILED,
                    &format!("coalesce(n.{next_at} <= datetime(), true)"),
                ),
            ),
            (
                INFLIGHT,
                lane(
                    INFLIGHT,
                    &format!("coalesce(n.{expires} <= datetime(), true)"),
                ),
            ),
        ];
        let eligible = format!(
            "(n.{status} = 'pending' \
              OR (n.{status} = 'failed' AND coalesce(n.{next_at} <= datetime(), true)) \
              OR (n.{status} = 'inflight' AND coalesce(n.{expires} <= datetime(), true)))"
        );
        let seek = |status_value: &str| {
            format!(
                "WITH s MATCH (n:{l}) USING INDEX n:{l}({stream}, {status}, {version}) \
                 WHERE n.{stream} = s AND n.{status} = '{status_value}' AND n.{version} IS NOT NULL \
                 RETURN n ORDER BY n.{stream} ASC, n.{status} ASC, n.{version} ASC LIMIT 1"
            )
        };
        // The least of the (at most three) seeks' nodes, without a sort.
        let successors = format!(
            "UNWIND $streams AS s \
             CALL {{ {} UNION {} UNION {} }} \
             WITH s, collect(n) AS ns \
             WITH reduce(m = null, x IN ns | CASE WHEN m IS NULL OR x.{version} < m.{version} THEN x ELSE m END) AS n \
             WITH n WHERE n.{id} IS :: STRING NOT NULL \
             RETURN n.{id} AS id, {eligible} AS due",
            seek(PENDING),
            seek(FAILED),
            seek(INFLIGHT)
        );
        // The next WALK_STEPS stream values after `$after`, in order: each
        // step one seek of the (stream, status, version) index past the
        // previous stream (its other nodes are not read), null once the
        // streams run out (OPTIONAL MATCH keeps the row).
        let mut walk = String::from("WITH $after AS s0");
        for i in 1..=WALK_STEPS {
            walk.push_str(&format!(
                " CALL {{ WITH s{prev} OPTIONAL MATCH (n:{l}) USING INDEX n:{l}({stream}, {status}, {version}) \
                 WHERE n.{stream} > s{prev} AND n.{status} IS NOT NULL AND n.{version} IS NOT NULL \
                 WITH n ORDER BY n.{stream} ASC LIMIT 1 RETURN n.{stream} AS s{i} }}",
                prev = i - 1,
            ));
        }
        let steps: Vec<String> = (1..=WALK_STEPS).map(|i| format!("s{i}")).collect();
        walk.push_str(&format!(
            " RETURN [s IN [{}] WHERE s IS NOT NULL] AS streams",
            steps.join(", ")
        ));
        let reserved = reserved_properties(config);
        let text = |prop: &Option<String>| match prop {
            Some(p) => format!("toStringOrNull(n.`{p}`)"),
            None => "null".to_string(),
        };
        let data = q(&config.event.data_property);
        let claim = format!(
            "UNWIND $ids AS claim_id \
             MATCH (n:{l}) WHERE n.{id} = claim_id \
             SET n.`{LOCK_PROPERTY}` = $token \
             REMOVE n.`{LOCK_PROPERTY}` \
             WITH n WHERE {eligible} AND {no_earlier} \
             SET n.{status} = 'inflight', n.{token} = $token, \
                 n.{expires} = datetime() + duration({{milliseconds: $lease_ms}}), \
                 n.{attempts} = coalesce(toIntegerOrNull(n.{attempts}), 0) + 1 \
             RETURN n.{id} AS id, n.{attempts} AS attempts, \
               CASE WHEN n.{stream} IS :: STRING NOT NULL THEN n.{stream} END AS stream, \
               toStringOrNull(n.{stream}) AS stream_text, \
               CASE WHEN n.{version} IS :: INTEGER NOT NULL THEN n.{version} END AS version, \
               toStringOrNull(n.{version}) AS version_text, \
               toStringOrNull(n.`{ty}`) AS type, {source} AS source, {subject} AS subject, \
               toStringOrNull(n.{created}) AS time, \
               CASE WHEN n.{data} IS :: STRING NOT NULL THEN n.{data} END AS data, \
               n.{data} IS NOT NULL AS has_data, \
               [k IN keys(n) WHERE NOT k IN {reserved} | k] AS ext_keys, \
               [k IN keys(n) WHERE NOT k IN {reserved} | toStringOrNull(n[k])] AS ext_values",
            ty = config.event.type_property,
            source = text(&config.event.source_property),
            subject = text(&config.event.subject_property),
        );
        let fenced = format!(
            "UNWIND range(0, size($ids) - 1) AS i \
             MATCH (n:{l}) WHERE n.{id} = $ids[i] AND n.{status} = 'inflight' AND n.{token} = $token"
        );
        let finish_delivered = format!(
            "{fenced} SET n.{status} = 'delivered', n.{delivered_at} = datetime(), n.{last_error} = null \
             REMOVE n.{token}, n.{expires} RETURN count(n) AS kept"
        );
        let finish_failed = format!(
            "{fenced} SET n.{status} = 'failed', n.{last_error} = $reasons[i], \
             n.{next_at} = datetime() + duration({{milliseconds: $delays[i]}}) \
             REMOVE n.{token}, n.{expires} RETURN count(n) AS kept"
        );
        let finish_dead = format!(
            "{fenced} SET n.{status} = 'dead', n.{last_error} = $reasons[i] \
             REMOVE n.{token}, n.{expires} RETURN count(n) AS kept"
        );
        let retention = format!(
            "MATCH (n:{l}) WHERE n.{status} = 'delivered' AND n.{delivered_at} < datetime() - duration({{milliseconds: $older_ms}}) \
             WITH n LIMIT $limit DETACH DELETE n RETURN count(*) AS deleted"
        );
        let oldest_pending = format!(
            "MATCH (n:{l}) USING INDEX n:{l}({status}, {created}) \
             WHERE n.{status} = 'pending' AND n.{created} IS :: ZONED DATETIME NOT NULL \
             WITH n ORDER BY n.{status} ASC, n.{created} ASC LIMIT 1 \
             RETURN duration.inSeconds(n.{created}, datetime()).milliseconds AS age_ms"
        );
        let missing_id = format!(
            "MATCH (n:{l}) USING INDEX n:{l}({status}) WHERE n.{status} IN ['pending', 'failed'] AND NOT (n.{id} IS :: STRING NOT NULL) \
             WITH n LIMIT $limit \
             SET n.{status} = 'dead', n.{last_error} = $reason RETURN count(n) AS dead"
        );
        Queries {
            missing_id,
            indexes,
            shortlist,
            successors,
            walk,
            claim,
            finish_delivered,
            finish_failed,
            finish_dead,
            retention,
            oldest_pending,
        }
    }
}

/// The properties of a node that are not extension attributes, as a
/// Cypher list of strings: the ones the relay reads or writes, the lock
/// property, and `event.ignore-properties`.
fn reserved_properties(config: &Neo4jSourceConfig) -> String {
    let p = &config.properties;
    let mut reserved: Vec<String> = [
        &p.event_id,
        &p.stream,
        &p.stream_version,
        &p.status,
        &p.attempts,
        &p.next_attempt_at,
        &p.created_at,
        &p.lease_token,
        &p.lease_expires_at,
        &p.last_error,
        &p.delivered_at,
        &config.event.type_property,
        &config.event.data_property,
    ]
    .into_iter()
    .cloned()
    .collect();
    reserved.push(LOCK_PROPERTY.to_string());
    reserved.extend(config.event.source_property.iter().cloned());
    reserved.extend(config.event.subject_property.iter().cloned());
    reserved.extend(config.event.ignore_properties.iter().cloned());
    format!(
        "[{}]",
        reserved
            .iter()
            .map(|r| format!("'{r}'"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// A claim transaction that has taken its nodes and not yet committed
/// (tests hold one open to race another relay against it).
pub struct OpenClaim {
    txn: neo4rs::Txn,
    /// The nodes taken, `inflight` under this claim's lease token.
    pub nodes: Vec<ClaimedNode>,
    timeout: Duration,
}

impl OpenClaim {
    /// Commit: the claim holds from now on.
    pub async fn commit(self) -> Result<Vec<ClaimedNode>, OutboxError> {
        let what = "commit claim";
        match tokio::time::timeout(self.timeout, self.txn.commit()).await {
            Ok(Ok(_)) => Ok(self.nodes),
            Ok(Err(source)) => Err(OutboxError::Neo4j { what, source }),
            Err(_) => Err(OutboxError::Timeout {
                what,
                timeout: self.timeout,
            }),
        }
    }
}

/// An outbox in one Neo4j database: its queries and a connection pool.
pub struct Outbox {
    graph: Graph,
    config: Neo4jSourceConfig,
    queries: Queries,
    /// Keyset cursor per lane: the next cycle goes on after it.
    cursors: Mutex<[String; 3]>,
    /// The walk's cursor: the last stream value it asked about.
    walked: Mutex<String>,
    /// Streams whose head this relay finished (delivered or dead), oldest
    /// first, at most [`SUCCESSORS_KEPT`]: their next node is the likely
    /// next head.
    successors: Mutex<Finished>,
}

/// The streams [`Outbox::note_finished`] remembers, oldest first, each
/// once (the set mirrors the queue, so remembering one is O(1)).
#[derive(Default)]
struct Finished {
    order: std::collections::VecDeque<String>,
    kept: HashSet<String>,
}

/// Most streams [`Outbox`] remembers as just finished; older ones are
/// forgotten (the lanes find their heads again).
const SUCCESSORS_KEPT: usize = 10_000;

impl Outbox {
    /// A pool for `config` (validated) with `password`. Connects lazily.
    pub fn connect(config: &Neo4jSourceConfig, password: &str) -> Result<Outbox, OutboxError> {
        let mut builder = neo4rs::ConfigBuilder::default()
            .uri(&config.url)
            .user(&config.user)
            .password(password)
            .max_connections(8)
            .connection_timeout(config.timeout);
        if let Some(db) = &config.database {
            builder = builder.db(db.as_str());
        }
        let what = "connect";
        let graph = builder
            .build()
            .and_then(Graph::connect)
            .map_err(|source| OutboxError::Neo4j { what, source })?;
        Ok(Outbox {
            graph,
            queries: Queries::new(config),
            config: config.clone(),
            cursors: Mutex::new(Default::default()),
            walked: Mutex::new(String::new()),
            successors: Mutex::new(Default::default()),
        })
    }

    /// The queries in use.
    pub fn queries(&self) -> &Queries {
        &self.queries
    }

    /// The driver's pool (tests write nodes through it).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    async fn timed<T>(
        &self,
        what: &'static str,
        f: impl std::future::Future<Output = Result<T, neo4rs::Error>>,
    ) -> Result<T, OutboxError> {
        match tokio::time::timeout(self.config.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(OutboxError::Neo4j { what, source }),
            Err(_) => Err(OutboxError::Timeout {
                what,
                timeout: self.config.timeout,
            }),
        }
    }

    /// Run `q` (auto-commit, retried by the driver on transient errors) and
    /// return its rows.
    async fn rows(
        &self,
        what: &'static str,
        q: Query,
        read: bool,
    ) -> Result<Vec<neo4rs::Row>, OutboxError> {
        self.timed(what, async {
            let mut stream = if read {
                self.graph.execute_read(q).await?
            } else {
                self.graph.execute(q).await?
            };
            let mut rows = Vec::new();
            while let Some(row) = stream.next().await? {
                rows.push(row);
            }
            Ok(rows)
        })
        .await
    }

    /// Create the indexes the relay's queries use (`IF NOT EXISTS`) and
    /// wait until they are online.
    pub async fn ensure_indexes(&self) -> Result<(), OutboxError> {
        for statement in &self.queries.indexes {
            self.timed("create index", self.graph.run(query(statement)))
                .await?;
        }
        let wait = format!(
            "CALL db.awaitIndexes({})",
            self.config.timeout.as_secs().max(1)
        );
        self.timed("await indexes", self.graph.run(query(&wait)))
            .await?;
        Ok(())
    }

    /// Read-only: up to `limit` event ids of due heads of streams, found
    /// three ways, in this order:
    ///
    /// 1. the heads of the streams this relay last finished
    ///    ([`Outbox::note_finished`]; one index seek per stream and live
    ///    status), leaving the others a quarter of `limit` (at least one);
    /// 2. the lanes (pending, failed and due, expired leases), keyset-paged
    ///    from each lane's cursor, at most `max-pages` pages per lane — one
    ///    page when the finished streams gave half of `limit` or more. A
    ///    lane stops after a full page in which fewer than a quarter of the
    ///    nodes were heads;
    /// 3. when the lanes saw due nodes behind their stream's head and there
    ///    is room left, the walk: stream by stream in stream order from its
    ///    cursor ([`Queries::walk`], one seek per stream), each stream's
    ///    head asked like the finished ones, until the claim is full or
    ///    `2 × limit` streams were asked.
    ///
    /// Why all three: a lane page finds one head per `pending ÷ streams`
    /// nodes it reads (one in five pages of 200 with 1,000 pending per
    /// stream), so a deep backlog relayed by lanes alone crawls (README,
    /// Performance), while a stream's head is one seek away once the
    /// stream is known — from a finish or from the walk. The lanes still
    /// find the streams the walk would reach late (few live streams among
    /// many finished ones). The lanes keep a quarter of every claim (one of
    /// a claim of 1: the finished streams then take no place) and never
    /// skip a head they had no room for (the cursor stops before it), and
    /// the walk goes round every stream, so every stream is reached however
    /// busy the finished ones are. The claim re-checks every id under its
    /// lock, so a stale id costs only its seek.
    pub async fn shortlist(&self, limit: usize) -> Result<Vec<String>, OutboxError> {
        let mut found: Vec<String> = Vec::new();
        let mut seen = HashSet::new();
        let lanes_keep = (limit / 4).max(1);
        let finished: Vec<String> = {
            let mut finished = self.successors.lock().unwrap();
            let n = limit.saturating_sub(lanes_keep).min(finished.order.len());
            let taken: Vec<String> = finished.order.drain(..n).collect();
            for stream in &taken {
                finished.kept.remove(stream);
            }
            taken
        };
        let asked: HashSet<String> = finished.iter().cloned().collect();
        self.heads_of(finished, limit, &mut found, &mut seen)
            .await?;
        let pages = if !found.is_empty() && found.len() >= limit / 2 {
            1
        } else {
            self.config.max_pages
        };
        let mut behind = false;
        for (lane, (_, text)) in self.queries.shortlist.iter().enumerate() {
            let mut after = self.cursors.lock().unwrap()[lane].clone();
            'pages: for _ in 0..pages {
                if found.len() >= limit {
                    break;
                }
                let q = query(text)
                    .param("after", after.clone())
                    .param("page", self.config.page_size as i64);
                let rows = self.rows("shortlist", q, true).await?;
                let full = rows.len() >= self.config.page_size as usize;
                let mut heads = 0;
                for row in &rows {
                    let shape = |e: neo4rs::DeError| OutboxError::Shape {
                        what: "shortlist",
                        detail: e.to_string(),
                    };
                    let id: String = row.get("id").map_err(shape)?;
                    let due: Option<bool> = row.get("due").map_err(shape)?;
                    let head: Option<bool> = row.get("head").map_err(shape)?;
                    match (due.unwrap_or(false), head.unwrap_or(false)) {
                        (true, true) if !seen.contains(&id) => {
                            if found.len() >= limit {
                                // No room: the next cycle starts at this head.
                                break 'pages;
                            }
                            heads += 1;
                            seen.insert(id.clone());
                            found.push(id.clone());
                        }
                        (true, false) => behind = true,
                        _ => {}
                    }
                    after = id;
                }
                if !full {
                    after = String::new();
                    break;
                }
                if heads * 4 < rows.len() {
                    // Mostly nodes behind their heads: the walk finds
                    // heads for less than the next page costs.
                    break;
                }
            }
            self.cursors.lock().unwrap()[lane] = after;
        }
        if behind {
            self.walk(limit, &asked, &mut found, &mut seen).await?;
        }
        Ok(found)
    }

    /// Remember the streams of nodes this relay just finished (delivered
    /// or dead): the next [`Outbox::shortlist`] seeks their next heads.
    pub fn note_finished(&self, streams: impl IntoIterator<Item = String>) {
        let mut finished = self.successors.lock().unwrap();
        for stream in streams {
            if finished.kept.insert(stream.clone()) {
                finished.order.push_back(stream);
            }
        }
        while finished.order.len() > SUCCESSORS_KEPT {
            if let Some(old) = finished.order.pop_front() {
                finished.kept.remove(&old);
            }
        }
    }

    /// The walk of [`Outbox::shortlist`]: the streams after the walk's
    /// cursor, never more at a time than there are places left in `found`
    /// (up to `limit`), and their due heads, until `found` is full or
    /// `2 × limit` streams were asked about (streams with nothing due: in
    /// flight with another relay, finished, failed and waiting). The
    /// streams in `asked_already` (this claim's finished streams, whose
    /// heads were just sought) are stepped over, not asked again. Past the
    /// last stream it goes on from the first, once per call.
    async fn walk(
        &self,
        limit: usize,
        asked_already: &HashSet<String>,
        found: &mut Vec<String>,
        seen: &mut HashSet<String>,
    ) -> Result<(), OutboxError> {
        let mut after = self.walked.lock().unwrap().clone();
        let mut wrapped = after.is_empty();
        let most = limit.saturating_mul(2);
        let mut asked = 0;
        while found.len() < limit && asked < most {
            let q = query(&self.queries.walk).param("after", after.clone());
            let rows = self.rows("walk", q, true).await?;
            let streams: Vec<String> = match rows.first() {
                Some(row) => row.get("streams").map_err(|e| OutboxError::Shape {
                    what: "walk",
                    detail: e.to_string(),
                })?,
                None => Vec::new(),
            };
            let to_the_end = streams.len() < WALK_STEPS;
            let room = (limit - found.len()).min(most - asked);
            let mut fresh = Vec::with_capacity(room);
            let mut stepped = 0;
            for stream in &streams {
                if fresh.len() == room {
                    break;
                }
                stepped += 1;
                if !asked_already.contains(stream) {
                    fresh.push(stream.clone());
                }
            }
            asked += fresh.len();
            after = if to_the_end && stepped == streams.len() {
                String::new()
            } else {
                streams[stepped - 1].clone()
            };
            self.heads_of(fresh, limit, found, seen).await?;
            if after.is_empty() {
                if wrapped {
                    break;
                }
                wrapped = true;
            }
        }
        *self.walked.lock().unwrap() = after;
        Ok(())
    }

    /// The due heads of `streams` ([`Queries::successors`]), added to
    /// `found` while it holds fewer than `limit`.
    async fn heads_of(
        &self,
        streams: Vec<String>,
        limit: usize,
        found: &mut Vec<String>,
        seen: &mut HashSet<String>,
    ) -> Result<(), OutboxError> {
        if streams.is_empty() || found.len() >= limit {
            return Ok(());
        }
        let q = query(&self.queries.successors).param("streams", streams);
        for row in self.rows("successors", q, true).await? {
            let shape = |e: neo4rs::DeError| OutboxError::Shape {
                what: "successors",
                detail: e.to_string(),
            };
            let id: String = row.get("id").map_err(shape)?;
            let due: Option<bool> = row.get("due").map_err(shape)?;
            if due.unwrap_or(false) && found.len() < limit && seen.insert(id.clone()) {
                found.push(id);
            }
        }
        Ok(())
    }

    /// The lock-first claim of `ids` (shortlisted) in a write transaction
    /// left open: each node is written first (taking its lock), then
    /// re-checked (eligible, no earlier live version of its stream), then
    /// leased for `lease` under a fresh token. Nodes that are no longer
    /// eligible are left as they are.
    pub async fn claim_open(&self, ids: &[String]) -> Result<OpenClaim, OutboxError> {
        let token = crate::store::new_lease_token();
        let mut ids = ids.to_vec();
        // One lock order for every relay: fewer deadlocks.
        ids.sort();
        ids.dedup();
        let what = "claim";
        let mut txn = self.timed(what, self.graph.start_txn()).await?;
        let q = query(&self.queries.claim)
            .param("ids", ids)
            .param("token", token.clone())
            .param("lease_ms", self.config.lease.as_millis() as i64);
        let rows = self
            .timed(what, async {
                let mut stream = txn.execute(q).await?;
                let mut rows = Vec::new();
                while let Some(row) = stream.next(txn.handle()).await? {
                    rows.push(row);
                }
                Ok(rows)
            })
            .await?;
        let mut nodes = Vec::with_capacity(rows.len());
        for row in rows {
            let shape = |e: neo4rs::DeError| OutboxError::Shape {
                what,
                detail: e.to_string(),
            };
            let keys: Vec<String> = row.get("ext_keys").map_err(shape)?;
            let values: Vec<Option<String>> = row.get("ext_values").map_err(shape)?;
            nodes.push(ClaimedNode {
                event_id: row.get("id").map_err(shape)?,
                lease_token: token.clone(),
                attempts: row.get("attempts").map_err(shape)?,
                stream: row.get("stream").map_err(shape)?,
                stream_text: row.get("stream_text").map_err(shape)?,
                version: row.get("version").map_err(shape)?,
                version_text: row.get("version_text").map_err(shape)?,
                ty: row.get("type").map_err(shape)?,
                source: row.get("source").map_err(shape)?,
                subject: row.get("subject").map_err(shape)?,
                time: row.get("time").map_err(shape)?,
                data: row.get("data").map_err(shape)?,
                has_data: row.get("has_data").map_err(shape)?,
                extensions: keys.into_iter().zip(values).collect(),
            });
        }
        Ok(OpenClaim {
            txn,
            nodes,
            timeout: self.config.timeout,
        })
    }

    /// Shortlist and claim up to `limit` nodes, committed. A claim
    /// transaction that fails with a transient error (deadlock with another
    /// relay, lock timeout) is retried a few times.
    pub async fn claim(&self, limit: usize) -> Result<Vec<ClaimedNode>, OutboxError> {
        let ids = self.shortlist(limit).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tries = 0;
        loop {
            let result = match self.claim_open(&ids).await {
                Ok(open) => open.commit().await,
                Err(e) => Err(e),
            };
            match result {
                Err(e) if e.transient() && tries < CLAIM_RETRIES => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(
                        rand::random_range(5..50u64) * tries as u64,
                    ))
                    .await;
                }
                other => return other,
            }
        }
    }

    async fn finish(
        &self,
        what: &'static str,
        text: &str,
        token: &str,
        ids: Vec<String>,
        extra: impl FnOnce(Query) -> Query,
    ) -> Result<u64, OutboxError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let q = extra(
            query(text)
                .param("ids", ids)
                .param("token", token.to_string()),
        );
        let rows = self.rows(what, q, false).await?;
        let kept: i64 = match rows.first() {
            Some(row) => row.get("kept").map_err(|e| OutboxError::Shape {
                what,
                detail: e.to_string(),
            })?,
            None => 0,
        };
        Ok(kept.max(0) as u64)
    }

    /// Mark `ids` (claimed under `token`) delivered, with the time.
    /// Returns how many still held the lease (the rest changed nothing).
    pub async fn finish_delivered(
        &self,
        token: &str,
        ids: Vec<String>,
    ) -> Result<u64, OutboxError> {
        self.finish(
            "finish delivered",
            &self.queries.finish_delivered,
            token,
            ids,
            |q| q,
        )
        .await
    }

    /// Mark nodes failed: tried again after each one's delay, with its
    /// reason. Returns how many still held the lease.
    pub async fn finish_failed(
        &self,
        token: &str,
        items: Vec<(String, Duration, String)>,
    ) -> Result<u64, OutboxError> {
        let mut ids = Vec::new();
        let mut delays = Vec::new();
        let mut reasons = Vec::new();
        for (id, delay, reason) in items {
            ids.push(id);
            delays.push(delay.as_millis() as i64);
            reasons.push(reason);
        }
        self.finish(
            "finish failed",
            &self.queries.finish_failed,
            token,
            ids,
            |q| q.param("delays", delays).param("reasons", reasons),
        )
        .await
    }

    /// Mark nodes dead (refused for good), with their reasons. Returns how
    /// many still held the lease.
    pub async fn finish_dead(
        &self,
        token: &str,
        items: Vec<(String, String)>,
    ) -> Result<u64, OutboxError> {
        let (ids, reasons): (Vec<String>, Vec<String>) = items.into_iter().unzip();
        self.finish("finish dead", &self.queries.finish_dead, token, ids, |q| {
            q.param("reasons", reasons)
        })
        .await
    }

    /// Delete up to `limit` delivered nodes older than `older_than`.
    pub async fn purge_delivered(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64, OutboxError> {
        let what = "retention";
        let q = query(&self.queries.retention)
            .param("older_ms", older_than.as_millis() as i64)
            .param("limit", limit as i64);
        let rows = self.rows(what, q, false).await?;
        let deleted: i64 = match rows.first() {
            Some(row) => row.get("deleted").map_err(|e| OutboxError::Shape {
                what,
                detail: e.to_string(),
            })?,
            None => 0,
        };
        Ok(deleted.max(0) as u64)
    }

    /// Mark dead up to `limit` waiting nodes whose event id is missing or
    /// not a string, with a reason naming the property. Returns how many.
    /// (No claim can hold such a node, so no lock-first is needed.)
    pub async fn mark_missing_ids(&self, limit: i64) -> Result<u64, OutboxError> {
        let what = "missing id";
        let reason = format!(
            "property `{}` (the event id) is missing or not a string",
            self.config.properties.event_id
        );
        let q = query(&self.queries.missing_id)
            .param("limit", limit)
            .param("reason", reason);
        let rows = self.rows(what, q, false).await?;
        let dead: i64 = match rows.first() {
            Some(row) => row.get("dead").map_err(|e| OutboxError::Shape {
                what,
                detail: e.to_string(),
            })?,
            None => 0,
        };
        Ok(dead.max(0) as u64)
    }

    /// Age of the oldest pending node (by its creation time), if any.
    pub async fn oldest_pending_age(&self) -> Result<Option<Duration>, OutboxError> {
        let what = "oldest pending";
        let rows = self
            .rows(what, query(&self.queries.oldest_pending), true)
            .await?;
        match rows.first() {
            Some(row) => {
                let ms: i64 = row.get("age_ms").map_err(|e| OutboxError::Shape {
                    what,
                    detail: e.to_string(),
                })?;
                Ok(Some(Duration::from_millis(ms.max(0) as u64)))
            }
            None => Ok(None),
        }
    }
}

/// Why a claimed node cannot become an event: the reason recorded on it,
/// naming the property.
fn to_event(
    config: &Neo4jSourceConfig,
    source_name: &str,
    node: &ClaimedNode,
) -> Result<NewEvent, String> {
    let p = &config.properties;
    let m = &config.event;
    let (stream, version) = stream_and_version(p, node)?;
    let ty = node
        .ty
        .clone()
        .ok_or_else(|| format!("property `{}` (the event type) is missing", m.type_property))?;
    let source = node
        .source
        .clone()
        .or_else(|| m.source.clone())
        .unwrap_or_else(|| format!("outboxd:neo4j/{source_name}"));
    let raw = |v: serde_json::Value| serde_json::value::to_raw_value(&v).expect("JSON value");
    let mut attrs: BTreeMap<String, Box<RawValue>> = BTreeMap::new();
    attrs.insert("specversion".into(), raw("1.0".into()));
    attrs.insert("id".into(), raw(node.event_id.clone().into()));
    attrs.insert("source".into(), raw(source.into()));
    attrs.insert("type".into(), raw(ty.into()));
    attrs.insert("partitionkey".into(), raw(stream.into()));
    attrs.insert("sequence".into(), raw(version.into()));
    if let Some(s) = &node.subject {
        attrs.insert("subject".into(), raw(s.clone().into()));
    }
    if let Some(t) = &node.time {
        attrs.insert("time".into(), raw(t.clone().into()));
    }
    let from_property = insert_extensions(node, &mut attrs)?;
    match (&node.data, node.has_data, m.data_format) {
        (None, false, _) => {}
        (None, true, _) => {
            return Err(format!("property `{}` must be a string", m.data_property));
        }
        (Some(d), _, DataFormat::Json) => {
            let data = RawValue::from_string(d.clone())
                .map_err(|e| format!("property `{}` is not JSON: {e}", m.data_property))?;
            attrs.insert("datacontenttype".into(), raw("application/json".into()));
            attrs.insert("data".into(), data);
        }
        (Some(d), _, DataFormat::Text) => {
            attrs.insert("datacontenttype".into(), raw("text/plain".into()));
            attrs.insert("data".into(), raw(d.clone().into()));
        }
    }
    let json = serde_json::to_string(&attrs).expect("JSON object");
    let raw_event = RawValue::from_string(json).expect("JSON text");
    NewEvent::from_json(&raw_event).map_err(|e| {
        let field = e.field.as_str();
        let property = match field {
            "id" => p.event_id.clone(),
            "partitionkey" => p.stream.clone(),
            "sequence" => p.stream_version.clone(),
            "type" => m.type_property.clone(),
            "time" => p.created_at.clone(),
            "data" => m.data_property.clone(),
            "source" => m
                .source_property
                .clone()
                .unwrap_or_else(|| "event.source".into()),
            "subject" => m.subject_property.clone().unwrap_or_default(),
            f => f
                .strip_prefix("extensions.")
                .and_then(|x| from_property.get(x).cloned())
                .unwrap_or_else(|| f.to_string()),
        };
        format!("property `{property}`: {}", e.problem)
    })
}

/// The stream (a string) and stream version (an integer from 1) of
/// `node`; errors name the property.
fn stream_and_version(p: &PropertyNames, node: &ClaimedNode) -> Result<(String, i64), String> {
    let stream = match (&node.stream, &node.stream_text) {
        (Some(s), _) => s.clone(),
        (None, Some(t)) => {
            return Err(format!(
                "property `{}` must be a string, got {t:?}",
                p.stream
            ))
        }
        (None, None) => return Err(format!("property `{}` (the stream) is missing", p.stream)),
    };
    let version = match (node.version, &node.version_text) {
        (Some(v), _) if v >= 1 => v,
        (Some(v), _) => {
            return Err(format!(
                "property `{}` must be an integer from 1, got {v}",
                p.stream_version
            ))
        }
        (None, Some(t)) => {
            return Err(format!(
                "property `{}` must be an integer, got {t:?}",
                p.stream_version
            ))
        }
        (None, None) => return Err(format!("property `{}` is missing", p.stream_version)),
    };
    Ok((stream, version))
}

/// Each other property of `node` as an extension attribute of `attrs`
/// (its name lowercased, letters and digits only). Returns which property
/// each extension came from, for error messages.
fn insert_extensions(
    node: &ClaimedNode,
    attrs: &mut BTreeMap<String, Box<RawValue>>,
) -> Result<BTreeMap<String, String>, String> {
    let raw = |v: serde_json::Value| serde_json::value::to_raw_value(&v).expect("JSON value");
    let mut from_property: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in &node.extensions {
        let ext: String = name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_lowercase())
            .collect();
        let Some(value) = value else {
            return Err(format!("property `{name}` has a value that cannot be an extension attribute (a list?); list it in event.ignore-properties"));
        };
        if ext.is_empty() || attrs.contains_key(&ext) || from_property.contains_key(&ext) {
            return Err(format!(
                "property `{name}` cannot be an extension attribute ({ext:?} is empty or taken); list it in event.ignore-properties"
            ));
        }
        from_property.insert(ext.clone(), name.clone());
        attrs.insert(ext, raw(value.clone().into()));
    }
    Ok(from_property)
}

/// What one relay cycle did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CycleReport {
    /// Nodes claimed.
    pub claimed: usize,
    /// Stored (or found already stored) and marked delivered.
    pub relayed: u64,
    /// Marked failed, to retry.
    pub failed: u64,
    /// Marked dead.
    pub dead: u64,
    /// Finishes whose lease token no longer matched.
    pub lease_lost: u64,
}

/// Name of the readiness check renewed by every cycle that reached Neo4j.
pub const CHECK_REACHABLE: &str = "neo4j_reachable";

/// Run the relay of source `name` until `shutdown` turns true (`Ok`) or a
/// cycle fails (`Err`, for the supervisor to run it again after a backoff):
/// connect, create the indexes, then claim cycles. Every cycle that reaches
/// Neo4j renews the [`CHECK_REACHABLE`] check (stale after
/// [`stale_after`]); a failure that did not reach it turns the check off.
pub async fn run(
    name: &str,
    config: &Neo4jSourceConfig,
    ctx: &SourceContext,
    status: &StatusHandle,
    shutdown: watch::Receiver<bool>,
) -> Result<(), OutboxError> {
    let result = Relay::prepare(name, config.clone(), ctx.clone());
    let result = match result {
        Ok(relay) => relay.run(status, shutdown).await,
        Err(e) => Err(e),
    };
    if let Err(e) = &result {
        if !e.connected() && !matches!(e, OutboxError::Config(_)) {
            status.check(CHECK_REACHABLE, false, Some(e.to_string()), None);
        }
    }
    result
}

/// A [`CHECK_REACHABLE`] check not renewed within this long turns not-ok:
/// a poll interval plus four query timeouts, at least 10 s.
pub fn stale_after(config: &Neo4jSourceConfig) -> Duration {
    (config.poll_interval + config.timeout * 4).max(Duration::from_secs(10))
}

/// A configured Neo4j relay.
#[derive(Clone)]
pub struct Relay {
    inner: Arc<RelayInner>,
}

struct RelayInner {
    name: String,
    config: Neo4jSourceConfig,
    password: String,
    ctx: SourceContext,
}

impl Relay {
    /// Read what is only known at run time (the password variable).
    pub fn prepare(
        name: &str,
        config: Neo4jSourceConfig,
        ctx: SourceContext,
    ) -> Result<Relay, OutboxError> {
        let password = match &config.password_env {
            None => String::new(),
            Some(var) => std::env::var(var).map_err(|_| {
                OutboxError::Config(format!(
                    "key `sources.{name}.password-env`: environment variable {var} is not set (or not UTF-8)"
                ))
            })?,
        };
        Ok(Relay {
            inner: Arc::new(RelayInner {
                name: name.to_string(),
                config,
                password,
                ctx,
            }),
        })
    }

    /// Connect, create the indexes, then run cycles until `shutdown`.
    /// Returns an error for the supervisor to restart after a backoff.
    pub async fn run(
        &self,
        status: &StatusHandle,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), OutboxError> {
        let inner = &self.inner;
        let fresh = Some(stale_after(&inner.config));
        let label = crate::metrics::SourceLabel {
            source: inner.name.clone(),
        };
        let outbox = Outbox::connect(&inner.config, &inner.password)?;
        outbox.ensure_indexes().await?;
        status.check(CHECK_REACHABLE, true, None, fresh);
        tracing::info!(source = %inner.name, url = %inner.config.url, label = %inner.config.label, "neo4j outbox relay started");
        let metrics = &inner.ctx.metrics;
        let mut last_retention: Option<Instant> = None;
        let mut last_oldest: Option<Instant> = None;
        let mut last_missing: Option<Instant> = None;
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            let started = Instant::now();
            let report = self.cycle(&outbox).await?;
            let retention_every = RETENTION_EVERY.min(inner.config.retention);
            if last_retention.is_none_or(|t| t.elapsed() >= retention_every) {
                last_retention = Some(Instant::now());
                for _ in 0..RETENTION_ROUNDS {
                    let n = outbox
                        .purge_delivered(inner.config.retention, inner.config.retention_batch)
                        .await?;
                    if n < inner.config.retention_batch as u64 {
                        break;
                    }
                }
            }
            if last_missing.is_none_or(|t| t.elapsed() >= MISSING_ID_EVERY) {
                last_missing = Some(Instant::now());
                let n = outbox.mark_missing_ids(MISSING_ID_BATCH).await?;
                if n > 0 {
                    tracing::warn!(source = %inner.name, nodes = n, "outbox nodes without a usable event id marked dead");
                    metrics.source_entries(&inner.name, "dead", n);
                }
            }
            if last_oldest.is_none_or(|t| t.elapsed() >= OLDEST_EVERY) {
                last_oldest = Some(Instant::now());
                let age = outbox.oldest_pending_age().await?;
                metrics
                    .source_oldest_pending_age
                    .get_or_create(&label)
                    .set(age.map_or(0.0, |a| a.as_secs_f64()));
            }
            let took = started.elapsed();
            status.check(CHECK_REACHABLE, true, None, fresh);
            status.cycle();
            metrics
                .source_cycle_duration
                .get_or_create(&label)
                .observe(took.as_secs_f64());
            // Anything claimed: the streams it finished likely have their
            // next node due, so look again at once; only a cycle that found
            // nothing waits the poll interval.
            if report.claimed > 0 {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(inner.config.poll_interval) => {}
                _ = shutdown.wait_for(|s| *s) => return Ok(()),
            }
        }
    }
    /// One cycle: claim, build events, ingest them in one store
    /// transaction, finish each node fenced. A node that cannot become an
    /// event, or whose id is stored with other content, is marked dead; a
    /// store failure marks the batch failed (retried with backoff) and
    /// fails the cycle.
    pub async fn cycle(&self, outbox: &Outbox) -> Result<CycleReport, OutboxError> {
        let inner = &self.inner;
        let claimed = outbox.claim(inner.config.batch_size as usize).await?;
        let mut report = CycleReport {
            claimed: claimed.len(),
            ..Default::default()
        };
        let Some(token) = claimed.first().map(|n| n.lease_token.clone()) else {
            return Ok(report);
        };
        let streams: Vec<String> = claimed.iter().filter_map(|n| n.stream.clone()).collect();
        let mut dead: Vec<(String, String)> = Vec::new();
        let mut good: Vec<(ClaimedNode, NewEvent)> = Vec::new();
        for node in claimed {
            match to_event(&inner.config, &inner.name, &node) {
                Ok(ev) => good.push((node, ev)),
                Err(reason) => {
                    tracing::warn!(source = %inner.name, event_id = %node.event_id, %reason, "outbox node refused");
                    dead.push((node.event_id, reason));
                }
            }
        }
        let store_error = self.ingest(&mut good, &mut dead).await;
        let metrics = &inner.ctx.metrics;
        if !dead.is_empty() {
            let n = dead.len() as u64;
            let kept = outbox.finish_dead(&token, dead).await?;
            report.dead += kept;
            report.lease_lost += n - kept;
        }
        if let Some(error) = &store_error {
            let items: Vec<(String, Duration, String)> = good
                .iter()
                .map(|(node, _)| {
                    (
                        node.event_id.clone(),
                        self.retry_delay(node.attempts),
                        format!("outboxd store: {error}"),
                    )
                })
                .collect();
            let n = items.len() as u64;
            let kept = outbox.finish_failed(&token, items).await?;
            report.failed += kept;
            report.lease_lost += n - kept;
        } else {
            let ids: Vec<String> = good.iter().map(|(n, _)| n.event_id.clone()).collect();
            let n = ids.len() as u64;
            let kept = outbox.finish_delivered(&token, ids).await?;
            report.relayed += kept;
            report.lease_lost += n - kept;
            // Each claimed stream moved on (delivered or dead): its next
            // node is likely due.
            outbox.note_finished(streams);
        }
        metrics.source_entries(&inner.name, "relayed", report.relayed);
        metrics.source_entries(&inner.name, "failed", report.failed);
        metrics.source_entries(&inner.name, "dead", report.dead);
        metrics.source_entries(&inner.name, "lease_lost", report.lease_lost);
        if report.lease_lost > 0 {
            tracing::warn!(source = %inner.name, lost = report.lease_lost, "finishes with a lease token no longer in force changed nothing");
        }
        match store_error {
            Some(e) => Err(OutboxError::Ingest(e)),
            None => Ok(report),
        }
    }

    /// Ingest the events of `good` in one store transaction. An event the
    /// store refuses as a conflict moves its node to `dead` (with the
    /// reason) and the rest are tried again. Returns the store's failure,
    /// if any (`good` then holds the nodes to mark failed).
    async fn ingest(
        &self,
        good: &mut Vec<(ClaimedNode, NewEvent)>,
        dead: &mut Vec<(String, String)>,
    ) -> Option<String> {
        let inner = &self.inner;
        let mut store_error = None;
        while !good.is_empty() {
            let events: Vec<NewEvent> = good.iter().map(|(_, e)| e.clone()).collect();
            let ctx = &inner.ctx;
            let call =
                crate::ingest::submit(&*ctx.store, &ctx.routes, &ctx.wake, &ctx.metrics, events);
            let result = match tokio::time::timeout(ctx.db_timeout, call).await {
                Ok(result) => result,
                Err(_) => {
                    store_error = Some(format!("no answer within {:?}", ctx.db_timeout));
                    break;
                }
            };
            match result {
                Ok(_) => break,
                Err(
                    e @ (IngestError::Conflict { .. } | IngestError::SequenceNotIncreasing { .. }),
                ) => {
                    let index = match &e {
                        IngestError::Conflict { index, .. }
                        | IngestError::SequenceNotIncreasing { index, .. } => *index,
                        IngestError::Store(_) => unreachable!(),
                    };
                    let (node, _) = good.remove(index);
                    let reason = e
                        .to_string()
                        .replacen(&format!("event [{index}] "), "event ", 1);
                    tracing::warn!(source = %inner.name, event_id = %node.event_id, %reason, "outbox node refused by the store");
                    dead.push((node.event_id, reason));
                }
                Err(IngestError::Store(e)) => {
                    store_error = Some(e.to_string());
                    break;
                }
            }
        }
        store_error
    }

    /// Retry delay after `attempts` attempts: base × 2^(attempts−1), capped,
    /// with up to 20% jitter.
    fn retry_delay(&self, attempts: i64) -> Duration {
        let c = &self.inner.config;
        let step = attempts.clamp(1, i64::from(u32::MAX)) as u32 - 1;
        let d = Backoff::doubling(c.retry_base, c.retry_cap).delay(step);
        d.mul_f64(1.0 + rand::random::<f64>() * 0.2)
            .min(c.retry_cap)
    }
}
