//! Durable state: events, per-stream sequences and deliveries.
//!
//! Owns: the [`Store`] trait every backend implements, the records that
//! cross it, and the rules each backend must keep:
//!
//! - ingest writes the events of a request and one delivery per routed sink
//!   in one transaction — all of it or none of it;
//! - idempotent on `id`: same canonical content → duplicate success with the
//!   original sequence, nothing queued; different content → conflict naming
//!   the attributes; never an overwrite;
//! - `sequence` per stream strictly increasing (gapless when assigned here);
//! - claims take only the head of each (stream, sink), set a random lease
//!   token and an expiry from the database's clock, and count the attempt;
//! - every change after a claim is fenced on (delivery, lease token);
//! - a failed attempt (a kept `Retry` or `Dead` finish) is recorded in
//!   `attempts` in its finish's transaction, at most
//!   [`crate::limits::ATTEMPTS_KEPT`] per delivery; a delivered one writes
//!   nothing there, so the happy path pays nothing.
//!
//! Must never: decide policy (retry delays, routing, what counts as
//! permanent) — callers pass decisions in; call plugins or the network.

mod migrate;
pub mod plan;
pub use migrate::OnApplied;
pub mod postgres;
mod shared;
pub mod sql;
pub mod sqlite;

pub use plan::DeliveryStatus;

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::event::NewEvent;

/// An event with its routing decision, ready to be stored.
#[derive(Debug, Clone)]
pub struct IngestItem {
    /// The event, checked.
    pub event: NewEvent,
    /// Sinks that get a delivery (may be empty: stored, not delivered).
    pub sinks: Vec<String>,
    /// The authenticated producer that posted it (`crate::auth`), stored
    /// with the event; `None` for an anonymous post on loopback, a source
    /// or the in-transaction outbox.
    pub producer: Option<String>,
}

/// The answer for one ingested event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ingested {
    /// The event's id.
    pub id: String,
    /// Its stream.
    pub stream: String,
    /// Its position in the stream.
    pub sequence: u64,
    /// True when an event with this id and the same content was already
    /// stored; `sequence` is then the original one and nothing was queued.
    pub duplicate: bool,
    /// Deliveries this request's transaction created for the event: 0 for
    /// a duplicate, and 0 when the router creates them later (a stream with
    /// events enqueued by SQL and not yet routed). Not part of the
    /// `POST /v1/events` answer; the awareness ingest reports it as
    /// `deliveriesQueued`.
    #[serde(skip)]
    pub deliveries_queued: u64,
}

/// Why an ingest request stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// Same id, different content (HTTP 409).
    #[error("event [{index}] id {id:?} was already stored with different {}", attributes.join(", "))]
    Conflict {
        /// Position of the event in its request, from 0.
        index: usize,
        /// The event's id.
        id: String,
        /// The attributes that differ from the stored event.
        attributes: Vec<String>,
    },
    /// A producer-supplied sequence not above the stream's last one (HTTP 409).
    #[error("event [{index}] id {id:?}: sequence {given} does not advance stream {stream:?} (last sequence {last})")]
    SequenceNotIncreasing {
        /// Position of the event in its request, from 0.
        index: usize,
        /// The event's id.
        id: String,
        /// Its stream.
        stream: String,
        /// The sequence the producer gave.
        given: u64,
        /// The stream's last sequence.
        last: u64,
    },
    /// The database failed (HTTP 503).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A database failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    /// The database refused or failed a call.
    Database(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    /// A migration failed.
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database has pending migrations: {0}; run `outboxd migrate` or start with --migrate")]
    /// Migrations not yet applied, named.
    PendingMigrations(String),
    #[error("stored row is corrupt: {0}")]
    /// A stored value cannot be read back (names the column).
    Corrupt(String),
    /// A stream's head that another session holds locked, so no claim can
    /// take it (PostgreSQL; shown by `/ready`).
    #[error("{0}")]
    HeadLocked(String),
}

impl StoreError {
    /// The database's disk is full: SQLite's `SQLITE_FULL` (result code
    /// 13, "database or disk is full"), PostgreSQL's `disk_full` (SQLSTATE
    /// 53100). The write that hit it was rolled back; it succeeds again
    /// once space is freed.
    pub fn is_storage_full(&self) -> bool {
        let StoreError::Database(sqlx::Error::Database(db)) = self else {
            return false;
        };
        matches!(db.code().as_deref(), Some("13") | Some("53100"))
    }
}

/// An event as stored.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    /// The event as ingested.
    pub event: NewEvent,
    /// Position in its stream (assigned or producer-supplied).
    pub sequence: u64,
    /// Commit time of the ingest, Unix milliseconds.
    pub ingested_at_ms: i64,
}

/// One delivery as reported by the read API.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeliveryInfo {
    /// The delivery key: a sink, or one destination of it.
    pub sink: String,
    /// Its state.
    pub status: DeliveryStatus,
    /// Attempts counted so far (at claim).
    pub attempts: u32,
    /// Why the last attempt failed, while it is not delivered.
    pub last_error: Option<String>,
    /// Unix milliseconds; `None` once delivered or dead.
    pub next_attempt_at_ms: Option<i64>,
    /// When it was delivered or dead-lettered, Unix milliseconds.
    pub finished_at_ms: Option<i64>,
}

/// How far one event's deliveries have got ([`Store::delivery_progress`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryProgress {
    /// Deliveries not finished yet (waiting, retrying or leased).
    pub open: u32,
    /// Deliveries the target acknowledged.
    pub delivered: u32,
    /// Dead-lettered deliveries.
    pub dead: u32,
    /// The last error of one dead-lettered delivery.
    pub dead_reason: Option<String>,
}

/// A delivery handed to a worker by [`Store::claim`].
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The delivery's row id.
    pub delivery_id: i64,
    /// Fencing token: every later change must present it.
    pub lease_token: String,
    /// Attempts including this one.
    pub attempts: u32,
    /// When the first attempt was claimed, Unix milliseconds (database clock).
    pub first_attempt_at_ms: i64,
    /// Database time of this claim, Unix milliseconds.
    pub claimed_at_ms: i64,
    /// The event to deliver.
    pub event: StoredEvent,
}

/// Live and dead deliveries of one sink, counted up to a cap.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SinkQueue {
    /// The delivery key.
    pub sink: String,
    /// Waiting for a first attempt.
    pub pending: u64,
    /// Waiting to retry after a failed attempt.
    pub retrying: u64,
    /// Under a live lease (being delivered).
    pub leased: u64,
    /// Leased, but the lease ran out unfinished (a worker died).
    pub expired_leases: u64,
    /// Dead-lettered.
    pub dead: u64,
    /// How long the oldest due head of a stream has been due, ms.
    pub oldest_due_age_ms: Option<i64>,
}

/// Queue figures over every sink.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueStats {
    /// Per delivery key, by name.
    pub sinks: Vec<SinkQueue>,
    /// True when the count stopped at the cap: figures are lower bounds.
    pub capped: bool,
}

/// Which dead letters an admin action applies to. Every given field must
/// match; none given matches all.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadFilter {
    /// This delivery key only.
    pub sink: Option<String>,
    /// This stream only.
    pub stream: Option<String>,
    /// This event only.
    pub event_id: Option<String>,
    /// Died at or after, Unix ms.
    pub since_ms: Option<i64>,
    /// Died before, Unix ms.
    pub until_ms: Option<i64>,
}

/// One dead letter.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The event's id.
    pub event_id: String,
    /// The delivery key.
    pub sink: String,
    /// The event's stream.
    pub stream: String,
    /// Its position in the stream.
    pub sequence: u64,
    /// Attempts made.
    pub attempts: u32,
    /// Why it was dead-lettered.
    pub reason: Option<String>,
    /// When, Unix milliseconds.
    pub died_at_ms: Option<i64>,
}

/// What became of a failed attempt, as the `attempts` table records it
/// (column `outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// The sink answered `retry` (or its `init` refused): tried again later.
    Retry,
    /// Dead-lettered: the sink rejected it, or its retry window ran out.
    Dead,
    /// The plugin trapped (panic, out of memory, a limit): the batch is
    /// retried.
    Trap,
    /// The plugin ran past its deadline: the batch is retried.
    Timeout,
}

impl AttemptOutcome {
    /// The stored and shown name: `retry`, `dead`, `trap`, `timeout`.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Retry => "retry",
            AttemptOutcome::Dead => "dead",
            AttemptOutcome::Trap => "trap",
            AttemptOutcome::Timeout => "timeout",
        }
    }

    /// The outcome named `name` ([`AttemptOutcome::as_str`]).
    pub fn parse(name: &str) -> Option<AttemptOutcome> {
        [
            AttemptOutcome::Retry,
            AttemptOutcome::Dead,
            AttemptOutcome::Trap,
            AttemptOutcome::Timeout,
        ]
        .into_iter()
        .find(|o| o.as_str() == name)
    }
}

impl std::fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the host knows of a failed attempt beyond its [`Finish`], given
/// to [`Store::finish_noted`] to be recorded in `attempts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptNote {
    /// What became of it.
    pub outcome: AttemptOutcome,
    /// The plugin call's wall time, ms (the whole batch's call: a sink is
    /// called with a batch).
    pub duration_ms: Option<i64>,
    /// The receiver's HTTP status or the broker's answer, as
    /// [`attempt_status`] reads it from the sink's own reason.
    pub status: Option<String>,
}

/// The receiver's answer a sink's reason names, by the convention of the
/// shipped sinks (docs/plugins.md, "Reasons"): a leading `HTTP nnn` (the
/// webhook, awareness and couchdb-mark sinks: `HTTP 503`, `HTTP 400:
/// body…`) gives the status `nnn`; a leading `nacked:` or `unroutable:`
/// (the amqp sink: the broker's `basic.nack`, or its `basic.return` of a
/// mandatory message no queue took) gives `nacked` or `unroutable`.
/// `None` for any other text.
pub fn attempt_status(reason: &str) -> Option<String> {
    let reason = reason.trim_start();
    if let Some(rest) = reason.strip_prefix("HTTP ") {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = rest[digits.len()..].chars().next();
        let ends = matches!(after, None | Some(':') | Some(' ') | Some(',') | Some(';'));
        return (digits.len() == 3 && ends).then_some(digits);
    }
    ["nacked", "unroutable"]
        .into_iter()
        .find(|answer| {
            reason
                .strip_prefix(answer)
                .is_some_and(|rest| rest.starts_with(':'))
        })
        .map(str::to_string)
}

/// Which failed attempts a listing returns ([`Store::list_attempts`]).
/// Every given field must match; none given matches all. Served by the
/// indexes `attempts (sink, attempted_at)`, `(event_id, sink, id)` and
/// `(attempted_at)`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttemptFilter {
    /// This delivery key (sink or destination) only.
    pub sink: Option<String>,
    /// This event only.
    pub event_id: Option<String>,
    /// Recorded at or after, Unix ms.
    pub since_ms: Option<i64>,
    /// Recorded before, Unix ms.
    pub until_ms: Option<i64>,
}

/// One failed attempt, as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attempt {
    /// The event's id.
    pub event_id: String,
    /// The delivery key.
    pub sink: String,
    /// The event's stream.
    pub stream: String,
    /// Its position in the stream.
    pub sequence: u64,
    /// The delivery's attempt number, from 1.
    pub attempt: u32,
    /// When the failure was recorded, Unix ms (database clock).
    pub attempted_at_ms: i64,
    /// The plugin call's wall time, ms, when known.
    pub duration_ms: Option<i64>,
    /// What became of it.
    pub outcome: AttemptOutcome,
    /// The receiver's HTTP status or the broker's answer, when known.
    pub status: Option<String>,
    /// Why it failed, as recorded with the delivery (`last_error`).
    pub reason: String,
}

/// Which events a search returns ([`Store::search_events`]). Every given
/// field must match; none given matches all. Each filter is served by an
/// index: `id` (unique), `stream` (`stream, sequence`), `type` and `source`
/// (`…, ingested_at, seq_id`), the time range and no filter
/// (`ingested_at, seq_id`); `state` is [`plan::state_sql`] on the
/// deliveries, checked per candidate through their `(event_id, sink)`
/// index or, for a rare state, read from its partial index first
/// (`deliveries_dead`, `deliveries_finished`, `deliveries_tried` for
/// leased and retrying) and ordered through `events_id_order`
/// (docs/console.md has the plans at 1,000,000 events).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EventFilter {
    /// This event only.
    pub id: Option<String>,
    /// This stream only.
    pub stream: Option<String>,
    /// CloudEvents `type`, exactly.
    pub ty: Option<String>,
    /// CloudEvents `source`, exactly.
    pub source: Option<String>,
    /// Posted by this producer (its name).
    pub producer: Option<String>,
    /// Ingested at or after, Unix ms.
    pub since_ms: Option<i64>,
    /// Ingested before, Unix ms.
    pub until_ms: Option<i64>,
    /// With at least one delivery in this state.
    pub state: Option<DeliveryStatus>,
}

/// One event in a search's answer (no payload).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventSummary {
    /// The event's id.
    pub id: String,
    /// CloudEvents `source`.
    pub source: String,
    /// CloudEvents `type`.
    #[serde(rename = "type")]
    pub ty: String,
    /// Its stream.
    pub stream: String,
    /// Its position in the stream.
    pub sequence: u64,
    /// Commit time of the ingest, Unix ms.
    pub ingested_at_ms: i64,
}

/// The head of one (delivery key, stream): the earliest live delivery,
/// the one the next claim of that key takes on that stream
/// ([`Store::stream_heads`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamHead {
    /// The delivery key (a sink, or one destination of it).
    pub sink: String,
    /// The head delivery's event.
    pub event_id: String,
    /// Its position in the stream.
    pub sequence: u64,
    /// Its state (`dead` for a dead letter that blocks the stream).
    pub status: DeliveryStatus,
    /// Attempts counted so far.
    pub attempts: u32,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// When the head may be claimed next, Unix ms; `None`: never, until
    /// the dead letter that blocks it is replayed or purged.
    pub due_at_ms: Option<i64>,
    /// Until when the current lease runs, Unix ms, while leased.
    pub lease_expires_at_ms: Option<i64>,
}

/// Another session holding a stream's head locked, so claims skip it
/// ([`Store::head_locks`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadLock {
    /// The delivery key whose head is held.
    pub sink: String,
    /// The holding session's server process id (PostgreSQL `pid`), when
    /// the lock's transaction could be matched to a session (`None` for a
    /// lock shared by several, a multixact).
    pub pid: Option<i32>,
    /// Its `application_name` (`outboxd` for a replica's own claim).
    pub application: Option<String>,
    /// Its client address, `None` over a Unix socket.
    pub client: Option<String>,
    /// Its `state` (`idle in transaction` is the usual culprit).
    pub state: Option<String>,
    /// When its transaction began, Unix ms.
    pub since_ms: Option<i64>,
}

/// One page of a backfill.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BackfillPage {
    /// Events looked at.
    pub scanned: u64,
    /// Deliveries created (0 for events that already had one).
    pub created: u64,
    /// Cursor for the next page; `None` when done.
    pub next_after: Option<i64>,
}

/// Most live-or-dead rows [`Store::queue_stats`] is asked to count for
/// `/ready` and the admin views (figures past it are marked `capped`), so
/// a huge backlog cannot make a probe slow.
pub const STATS_COUNT_CAP: u64 = 100_000;

/// A producer as stored: its name and the host's JSON record of it.
#[derive(Debug, Clone)]
pub struct ProducerRow {
    /// Its name (unique).
    pub name: String,
    /// The host's record of it (`auth::Producer`), JSON text.
    pub record: String,
    /// 1 when created, one more on every write.
    pub revision: i64,
}

/// One destination as stored (see `crate::destinations`): its name — the
/// delivery key its deliveries are stored under — its sink, and the host's
/// record of it as JSON text, which the store keeps whole and never reads.
#[derive(Debug, Clone)]
pub struct DestinationRow {
    /// Its name: the delivery key its deliveries are stored under.
    pub name: String,
    /// The sink (plugin) it is a target of.
    pub sink: String,
    /// The host's record of it, JSON text.
    pub record: String,
    /// 1 when created, one more on every write.
    pub revision: i64,
    /// Unix ms, database clock.
    pub updated_at_ms: i64,
}

/// How [`Store::put_destination`] may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    /// Only when no destination of that name exists.
    Create,
    /// Create or replace, whatever is stored.
    Upsert,
    /// Only when the stored revision is this one (optimistic concurrency
    /// for a read-modify-write).
    Revision(i64),
}

/// What [`Store::purge_target`] deleted.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Purged {
    /// Deliveries not yet delivered (pending, retrying or leased).
    pub pending: u64,
    /// Dead letters.
    pub dead: u64,
}

/// A sink's identity as a replica loaded it (see `crate::fleet`): two
/// file hashes, each the lower-case hex SHA-256 `sha256sum` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SinkIdentity {
    /// The sink's name.
    pub name: String,
    /// Manifest `version`.
    pub version: String,
    /// SHA-256 of its `.wasm` file (`sha256sum my-sink.wasm`); for a
    /// builtin sink, which has none, of its manifest.
    pub component_sha: String,
    /// SHA-256 of its manifest file (`sha256sum my-sink.toml`).
    pub manifest_sha: String,
}

/// A sink in the fleet's registry.
#[derive(Debug, Clone, Serialize)]
pub struct RegisteredSink {
    /// The sink's name.
    pub name: String,
    /// The identity it was first registered with.
    pub version: String,
    /// SHA-256 of its `.wasm` file, as [`SinkIdentity::component_sha`]
    /// (a row registered before migration 0011: of manifest and component
    /// bytes together).
    pub component_sha: String,
    /// SHA-256 of its manifest file (empty in a row registered before
    /// migration 0011).
    pub manifest_sha: String,
    /// Unix ms, database clock.
    pub registered_at_ms: i64,
    /// Set by `outboxd sinks retire`: no longer routed to.
    pub retired_at_ms: Option<i64>,
}

/// One replica's last report of a sink it serves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SinkReplica {
    /// The replica's id (hostname-pid-random).
    pub replica: String,
    /// A sink it serves.
    pub sink: String,
    /// The manifest version it runs.
    pub version: String,
    /// SHA-256 of the `.wasm` file it runs, as `sha256sum` prints it (see
    /// [`SinkIdentity::component_sha`]).
    pub component_sha: String,
    /// SHA-256 of the manifest it runs, as `sha256sum` prints it (empty
    /// from a daemon that predates it).
    #[serde(default)]
    pub manifest_sha: String,
    /// Time since that report, ms (database clock).
    pub age_ms: i64,
}

/// Routing decision handed to the store: the sinks an event goes to.
pub type RouteFn<'a> = dyn for<'e> Fn(&'e NewEvent) -> Vec<String> + Send + Sync + 'a;

/// How a claimed delivery ends this attempt.
#[derive(Debug, Clone)]
pub enum Finish {
    /// The sink acknowledged it.
    Delivered,
    /// Try again after `delay` (from the database's now).
    Retry {
        /// How long from the database's now.
        delay: Duration,
        /// Why the attempt failed (kept as `last_error`).
        reason: String,
    },
    /// Dead-letter it with `reason`. With `blocks_stream`, its stream stays
    /// blocked for this sink behind it until it is replayed or purged (its
    /// head is kept, due never); otherwise the stream moves on.
    Dead {
        /// Why (kept as `last_error`).
        reason: String,
        /// Whether its stream waits behind it (`on-dead = "block"`).
        blocks_stream: bool,
    },
    /// Give the lease back without charging the attempt: the delivery was
    /// not tried (an earlier event of its stream failed in the same batch).
    /// It becomes due again at once and waits for its predecessor.
    Release,
}

/// The durable store. Implementations: [`postgres::PgStore`],
/// [`sqlite::SqliteStore`].
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The runner the shared operations ([`shared`]) use.
    fn sql(&self) -> &dyn sql::Sql;

    /// An event, by id, without its deliveries.
    async fn stored_event(&self, id: &str) -> Result<Option<StoredEvent>, StoreError> {
        shared::stored_event(self.sql(), id).await
    }

    /// How far the deliveries of each of `ids` have got, by event id;
    /// events without deliveries (routed nowhere) or unknown are absent.
    async fn delivery_progress(
        &self,
        ids: &[String],
    ) -> Result<std::collections::BTreeMap<String, DeliveryProgress>, StoreError> {
        shared::delivery_progress(self.sql(), ids).await
    }

    /// Store a request's events and their deliveries in one transaction.
    /// Returns one [`Ingested`] per item, in order. Either every new event
    /// is stored or, on error, none is.
    async fn ingest(&self, items: &[IngestItem]) -> Result<Vec<Ingested>, IngestError>;

    /// An event and its deliveries, by id.
    async fn event(
        &self,
        id: &str,
    ) -> Result<Option<(StoredEvent, Vec<DeliveryInfo>)>, StoreError> {
        let Some(event) = self.stored_event(id).await? else {
            return Ok(None);
        };
        Ok(Some((event, shared::deliveries_of(self.sql(), id).await?)))
    }

    /// Claim for a chained sink: as [`Store::claim`], and when `after`
    /// names another sink, a delivery is taken only once the same event's
    /// delivery to `after` is delivered (an event with no delivery to
    /// `after` is not held back). A held-back head is looked at again a
    /// second later.
    ///
    /// Claim up to `limit` deliveries of `sink` that are due (pending and
    /// their next attempt time reached, or holding an expired lease) and at
    /// the head of their stream for this sink. Sets a fresh lease token and
    /// expiry `now + lease` (database clock) and counts the attempt.
    async fn claim_after(
        &self,
        sink: &str,
        limit: u32,
        lease: Duration,
        after: Option<&str>,
    ) -> Result<Vec<Claimed>, StoreError>;

    /// [`Store::claim_after`] with no chain.
    async fn claim(
        &self,
        sink: &str,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<Claimed>, StoreError> {
        self.claim_after(sink, limit, lease, None).await
    }

    /// Record the outcome of a claimed delivery, fenced on its lease token.
    /// Returns false when the lease was lost (nothing changed).
    async fn finish(
        &self,
        delivery_id: i64,
        lease_token: &str,
        finish: &Finish,
    ) -> Result<bool, StoreError> {
        let kept = self
            .finish_many(&[(delivery_id, lease_token, finish)])
            .await?;
        Ok(kept.first().copied().unwrap_or(false))
    }

    /// [`Store::finish`] for a whole batch, in one transaction: one commit
    /// instead of one per delivery. Returns, per item, whether the lease was
    /// still held. Failed attempts are recorded as [`Store::finish_noted`]
    /// records them with no notes.
    async fn finish_many(&self, items: &[(i64, &str, &Finish)]) -> Result<Vec<bool>, StoreError> {
        self.finish_noted(items, &[]).await
    }

    /// [`Store::finish_many`], recording in the same transaction one row
    /// of `attempts` per kept `Retry` or `Dead` finish (a `Delivered` or
    /// `Release` writes nothing there): `notes[i]`, when given, says what
    /// the host knows of `items[i]`'s attempt; without it the outcome is
    /// `retry` or `dead` by the finish, the duration unknown and the
    /// status [`attempt_status`] of the finish's reason. Past
    /// [`crate::limits::ATTEMPTS_KEPT`] rows for a delivery, its oldest
    /// are deleted in that transaction too.
    async fn finish_noted(
        &self,
        items: &[(i64, &str, &Finish)],
        notes: &[Option<AttemptNote>],
    ) -> Result<Vec<bool>, StoreError>;

    /// Time until the earliest pending delivery of `sink` becomes due (zero
    /// if one is due now); `None` when it has none pending.
    async fn next_due_in(&self, sink: &str) -> Result<Option<Duration>, StoreError>;

    /// Create the deliveries of up to `limit` events that were enqueued
    /// without routing (by SQL, inside an application's transaction),
    /// using `route` to pick their sinks. Returns how many events it routed.
    async fn route_pending(&self, route: &RouteFn<'_>, limit: u32) -> Result<usize, StoreError>;

    /// Start forwarding wake-ups from other processes (PostgreSQL
    /// LISTEN/NOTIFY on ingest, naming the delivery keys queued: see
    /// [`crate::wakeups::payload`]) to `wake`, reconnecting after failures,
    /// until `stop` turns true. A store without cross-process wake-ups does
    /// nothing.
    fn forward_wakeups(
        &self,
        wake: std::sync::Arc<crate::wakeups::Wakeups>,
        stop: tokio::sync::watch::Receiver<bool>,
    );

    /// Queue figures per sink, counting at most `cap` live-or-dead rows.
    async fn queue_stats(&self, cap: u64) -> Result<QueueStats, StoreError> {
        shared::queue_stats(self.sql(), cap).await
    }

    /// Dead letters matching `filter`, newest first, at most `limit`.
    async fn list_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        shared::list_dead(self.sql(), filter, limit).await
    }

    /// Events matching `filter`, newest first (ingest time, then row),
    /// at most `limit` (the caller bounds it).
    async fn search_events(
        &self,
        filter: &EventFilter,
        limit: u32,
    ) -> Result<Vec<EventSummary>, StoreError> {
        shared::search_events(self.sql(), filter, limit).await
    }

    /// The head of `stream` for every delivery key that has live
    /// deliveries on it, by key.
    async fn stream_heads(&self, stream: &str) -> Result<Vec<StreamHead>, StoreError> {
        shared::stream_heads(self.sql(), stream).await
    }

    /// The heads of `stream` that another session holds locked at this
    /// moment, so that a claim would skip them (PostgreSQL's `FOR UPDATE
    /// … SKIP LOCKED`), with the holder where it can be named. A store
    /// with one writer and no row locks (SQLite) has none.
    async fn head_locks(&self, _stream: &str) -> Result<Vec<HeadLock>, StoreError> {
        Ok(Vec::new())
    }

    /// Make up to `limit` matching dead letters pending again: attempts and
    /// retry window start afresh. Returns how many.
    async fn replay_dead(&self, filter: &DeadFilter, limit: u32) -> Result<u64, StoreError> {
        shared::replay_dead(self.sql(), filter, limit).await
    }

    /// Delete up to `limit` matching dead letters. Returns how many.
    async fn purge_dead(&self, filter: &DeadFilter, limit: u32) -> Result<u64, StoreError> {
        shared::purge_dead(self.sql(), filter, limit).await
    }

    /// Failed attempts matching `filter`, newest first, at most `limit`
    /// (the caller bounds it).
    async fn list_attempts(
        &self,
        filter: &AttemptFilter,
        limit: u32,
    ) -> Result<Vec<Attempt>, StoreError> {
        shared::list_attempts(self.sql(), filter, limit).await
    }

    /// Delete up to `limit` failed attempts recorded more than
    /// `older_than` ago. Returns how many.
    async fn purge_attempts(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError> {
        shared::purge_attempts(self.sql(), older_than, limit).await
    }

    /// Pause (nothing claimed, nothing lost) or resume a sink.
    async fn set_paused(&self, sink: &str, paused: bool) -> Result<(), StoreError> {
        shared::set_paused(self.sql(), sink, paused).await
    }

    /// Sinks currently paused.
    async fn paused_sinks(&self) -> Result<Vec<String>, StoreError> {
        shared::paused_sinks(self.sql()).await
    }

    /// Delete up to `limit` deliveries delivered more than `older_than` ago.
    /// Returns how many.
    async fn purge_delivered(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError> {
        shared::purge_delivered(self.sql(), older_than, limit).await
    }

    /// Create deliveries for `sink` over up to `page` events ingested at or
    /// after `since_ms`, after the cursor `after` (start with 0), whose
    /// routes include `sink`. Idempotent: an event that already has a
    /// delivery for `sink` gets no second one. Heads of the touched streams
    /// are recomputed so the oldest live delivery goes first.
    async fn backfill_page(
        &self,
        sink: &str,
        since_ms: i64,
        after: i64,
        page: u32,
        route: &RouteFn<'_>,
    ) -> Result<BackfillPage, StoreError> {
        shared::backfill_page(self.sql(), sink, since_ms, after, page, route).await
    }

    /// Names of migrations not yet applied.
    async fn pending_migrations(&self) -> Result<Vec<String>, StoreError> {
        let uninitialised = self.is_uninitialised().await?;
        shared::pending_migrations(self.sql(), self.sql().migrator(), uninitialised).await
    }

    /// True when no migration was ever applied (a new, empty database).
    async fn is_uninitialised(&self) -> Result<bool, StoreError> {
        let sql = self.sql();
        let rows = sql
            .read(sql::Stmt::new(
                sql.dialect().no_migrations.to_string(),
                &[sql::Col::Bool],
            ))
            .await?;
        Ok(rows.first().is_some_and(|r| r[0] == sql::Val::Bool(true)))
    }

    /// Apply pending migrations.
    async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_each(&mut |_| {}).await
    }

    /// Apply pending migrations one at a time, in version order, calling
    /// `applied` with each one's name (`VERSION_description`) once it is
    /// applied ([`migrate::run_each`]).
    async fn migrate_each(&self, applied: &mut OnApplied<'_>) -> Result<(), StoreError>;

    /// Check that the database answers.
    async fn ping(&self) -> Result<(), StoreError> {
        shared::ping(self.sql()).await
    }

    /// The checkpoint source `source` (a `[sources.NAME]` name) last saved,
    /// as it saved it; `None` before its first save. A checkpoint is a
    /// shortcut for where to resume, never a reason to skip work.
    async fn source_checkpoint(&self, source: &str) -> Result<Option<String>, StoreError> {
        shared::source_checkpoint(self.sql(), source).await
    }

    /// Save `checkpoint` as source `source`'s, replacing the previous one.
    async fn save_source_checkpoint(
        &self,
        source: &str,
        checkpoint: &str,
    ) -> Result<(), StoreError> {
        shared::save_source_checkpoint(self.sql(), source, checkpoint).await
    }

    /// Every destination, by name.
    async fn destinations(&self) -> Result<Vec<DestinationRow>, StoreError> {
        shared::destinations(self.sql()).await
    }

    /// Write destination `name` as `mode` allows. Returns the new revision,
    /// or `None` when `mode` refused (it exists on `Create`; another
    /// revision is stored on `Revision`).
    async fn put_destination(
        &self,
        name: &str,
        sink: &str,
        record: &str,
        mode: PutMode,
    ) -> Result<Option<i64>, StoreError> {
        shared::put_destination(self.sql(), name, sink, record, mode).await
    }

    /// Every producer (`crate::auth`), by name.
    async fn producers(&self) -> Result<Vec<ProducerRow>, StoreError> {
        shared::producers(self.sql()).await
    }

    /// Write producer `name`'s record as `mode` allows (as
    /// [`Store::put_destination`]). Returns the new revision, or `None`
    /// when `mode` refused.
    async fn put_producer(
        &self,
        name: &str,
        record: &str,
        mode: PutMode,
    ) -> Result<Option<i64>, StoreError> {
        shared::put_producer(self.sql(), name, record, mode).await
    }

    /// The producer that posted event `id` (`None`: anonymous, a source,
    /// the in-transaction outbox, or no such event).
    async fn event_producer(&self, id: &str) -> Result<Option<String>, StoreError> {
        shared::event_producer(self.sql(), id).await
    }

    /// Delete destination `name` and its health; its deliveries stay
    /// (parked under its name until one of that name exists again, or
    /// [`Store::purge_target`]). Returns whether it existed.
    async fn delete_destination(&self, name: &str) -> Result<bool, StoreError> {
        shared::delete_destination(self.sql(), name).await
    }

    /// Delete every delivery of delivery key `key` that is not delivered
    /// (pending, retrying, leased and dead), and its heads, in one
    /// transaction.
    async fn purge_target(&self, key: &str) -> Result<Purged, StoreError> {
        shared::purge_target(self.sql(), key).await
    }

    /// The health record (host JSON) of every destination that has one.
    async fn destination_health(&self) -> Result<Vec<(String, String)>, StoreError> {
        shared::destination_health(self.sql()).await
    }

    /// Replace the health record of destination `name`.
    async fn save_destination_health(&self, name: &str, health: &str) -> Result<(), StoreError> {
        shared::save_destination_health(self.sql(), name, health).await
    }

    /// Register every sink of `sinks` not registered yet (a retired one
    /// stays retired). Returns the names newly registered.
    async fn register_sinks(&self, sinks: &[SinkIdentity]) -> Result<Vec<String>, StoreError> {
        shared::register_sinks(self.sql(), sinks).await
    }

    /// The fleet's registry, by name.
    async fn registered_sinks(&self) -> Result<Vec<RegisteredSink>, StoreError> {
        shared::registered_sinks(self.sql()).await
    }

    /// Record that `replica` serves exactly `sinks` now (its earlier report
    /// is replaced; reports older than an hour, of any replica, deleted).
    async fn beat_replica(&self, replica: &str, sinks: &[SinkIdentity]) -> Result<(), StoreError> {
        shared::beat_replica(self.sql(), replica, sinks).await
    }

    /// Every replica's last report, by sink then replica.
    async fn sink_replicas(&self) -> Result<Vec<SinkReplica>, StoreError> {
        shared::sink_replicas(self.sql()).await
    }

    /// Retire sink `name`: no replica routes new events to it. Returns
    /// false when it is not registered or already retired.
    async fn retire_sink(&self, name: &str) -> Result<bool, StoreError> {
        shared::retire_sink(self.sql(), name).await
    }
}

/// Open the store named by a database URL: `postgres://…` /
/// `postgresql://…`, or `sqlite://PATH`.
///
/// Errors: an unsupported scheme, or the database cannot be opened.
pub async fn open(url: &str) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    open_with(url, crate::limits::STATEMENT_TIMEOUT).await
}

/// [`open`], with PostgreSQL statements limited to `statement_timeout`
/// (the daemon passes `delivery.db-timeout`).
pub async fn open_with(
    url: &str,
    statement_timeout: Duration,
) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(std::sync::Arc::new(
            postgres::PgStore::open(url, statement_timeout).await?,
        ));
    }
    if let Some(path) = sqlite_path(url) {
        return Ok(std::sync::Arc::new(sqlite::SqliteStore::open(path).await?));
    }
    Err(StoreError::Database(sqlx::Error::Configuration(
        format!(
            "unsupported database URL {:?}: expected postgres://… or sqlite://PATH",
            redact_url(url)
        )
        .into(),
    )))
}

/// The file a `sqlite://PATH` (or `sqlite:PATH`) URL names; `None` for any
/// other URL. [`open`] creates that file when it is missing, so a command
/// that must not create state checks for it first.
pub fn sqlite_path(url: &str) -> Option<&str> {
    url.strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
}

/// The URL with any password replaced by `***`, for logs and errors.
pub use crate::redact::redact_url;

/// Random lease token: 128 bits as 32 hex digits.
pub(crate) fn new_lease_token() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// The event columns every read of events selects first, in this order
/// ([`EVENT_COLS`]), with the ingest time as Unix ms in the dialect's
/// spelling.
pub(crate) fn event_columns(d: &sql::Dialect) -> String {
    format!(
        "id, source, type, subject, time, datacontenttype, dataschema, stream, sequence, \
         producer_sequence, extensions, data, data_format, {} AS ingested_at_ms",
        d.time_as_ms("ingested_at")
    )
}

/// The types of [`event_columns`], in order.
pub(crate) const EVENT_COLS: &[sql::Col] = {
    use sql::Col::*;
    &[
        Text, Text, Text, OptText, OptText, OptText, OptText, Text, Int, Bool, Text, Bytes, Text,
        Int,
    ]
};

/// An event read as [`event_columns`] (the first columns of `v`).
/// Errors: extensions that are not a JSON object of strings.
pub(crate) fn event_from_vals(v: &[sql::Val]) -> Result<StoredEvent, StoreError> {
    if v.len() < EVENT_COLS.len() {
        return Err(StoreError::Corrupt(format!(
            "an event row has {} columns, not {}",
            v.len(),
            EVENT_COLS.len()
        )));
    }
    let extensions: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&v[10].text())
            .map_err(|e| StoreError::Corrupt(format!("events.extensions: {e}")))?;
    let sequence = v[8].int() as u64;
    Ok(StoredEvent {
        event: NewEvent {
            id: v[0].text(),
            source: v[1].text(),
            ty: v[2].text(),
            subject: v[3].opt_text(),
            time: v[4].opt_text(),
            datacontenttype: v[5].opt_text(),
            dataschema: v[6].opt_text(),
            stream: v[7].text(),
            sequence: v[9].bool().then_some(sequence),
            extensions,
            data: v[11].bytes(),
            data_format: crate::event::DataFormat::parse(&v[12].text()),
        },
        sequence,
        ingested_at_ms: v[13].int(),
    })
}

/// An event row of a backend's own query, selected as [`event_columns`]
/// first. Errors: a column of another type, corrupt extensions.
pub(crate) fn event_from_row<'r, R>(row: &'r R) -> Result<StoredEvent, StoreError>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    event_from_vals(&sql::decode(row, EVENT_COLS)?)
}
