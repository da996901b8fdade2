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
//! - every change after a claim is fenced on (delivery, lease token).
//!
//! Must never: decide policy (retry delays, routing, what counts as
//! permanent) — callers pass decisions in; call plugins or the network.

pub mod postgres;
pub mod sqlite;

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::event::NewEvent;

/// An event with its routing decision, ready to be stored.
#[derive(Debug, Clone)]
pub struct IngestItem {
    pub event: NewEvent,
    /// Sinks that get a delivery (may be empty: stored, not delivered).
    pub sinks: Vec<String>,
}

/// The answer for one ingested event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ingested {
    pub id: String,
    pub stream: String,
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
        index: usize,
        id: String,
        attributes: Vec<String>,
    },
    /// A producer-supplied sequence not above the stream's last one (HTTP 409).
    #[error("event [{index}] id {id:?}: sequence {given} does not advance stream {stream:?} (last sequence {last})")]
    SequenceNotIncreasing {
        index: usize,
        id: String,
        stream: String,
        given: u64,
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
    Database(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database has pending migrations: {0}; run `outboxd migrate` or start with --migrate")]
    PendingMigrations(String),
    #[error("stored row is corrupt: {0}")]
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
    pub event: NewEvent,
    /// Position in its stream (assigned or producer-supplied).
    pub sequence: u64,
    /// Commit time of the ingest, Unix milliseconds.
    pub ingested_at_ms: i64,
}

/// One delivery as reported by the read API.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryInfo {
    pub sink: String,
    /// `pending`, `leased`, `retrying`, `delivered` or `dead`.
    pub status: String,
    pub attempts: u32,
    pub last_error: Option<String>,
    /// Unix milliseconds; `None` once delivered or dead.
    pub next_attempt_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
}

/// A delivery handed to a worker by [`Store::claim`].
#[derive(Debug, Clone)]
pub struct Claimed {
    pub delivery_id: i64,
    /// Fencing token: every later change must present it.
    pub lease_token: String,
    /// Attempts including this one.
    pub attempts: u32,
    /// When the first attempt was claimed, Unix milliseconds (database clock).
    pub first_attempt_at_ms: i64,
    /// Database time of this claim, Unix milliseconds.
    pub claimed_at_ms: i64,
    pub event: StoredEvent,
}

/// Live and dead deliveries of one sink, counted up to a cap.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SinkQueue {
    pub sink: String,
    /// Waiting for a first attempt.
    pub pending: u64,
    /// Waiting to retry after a failed attempt.
    pub retrying: u64,
    /// Under a live lease (being delivered).
    pub leased: u64,
    /// Leased, but the lease ran out unfinished (a worker died).
    pub expired_leases: u64,
    pub dead: u64,
    /// How long the oldest due head of a stream has been due, ms.
    pub oldest_due_age_ms: Option<i64>,
}

/// Queue figures over every sink.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueStats {
    pub sinks: Vec<SinkQueue>,
    /// True when the count stopped at the cap: figures are lower bounds.
    pub capped: bool,
}

/// Which dead letters an admin action applies to. Every given field must
/// match; none given matches all.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadFilter {
    pub sink: Option<String>,
    pub stream: Option<String>,
    pub event_id: Option<String>,
    /// Died at or after, Unix ms.
    pub since_ms: Option<i64>,
    /// Died before, Unix ms.
    pub until_ms: Option<i64>,
}

/// One dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    pub event_id: String,
    pub sink: String,
    pub stream: String,
    pub sequence: u64,
    pub attempts: u32,
    pub reason: Option<String>,
    pub died_at_ms: Option<i64>,
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

/// One destination as stored (see `crate::destinations`): its name — the
/// delivery key its deliveries are stored under — its sink, and the host's
/// record of it as JSON text, which the store keeps whole and never reads.
#[derive(Debug, Clone)]
pub struct DestinationRow {
    pub name: String,
    pub sink: String,
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
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Purged {
    /// Deliveries not yet delivered (pending, retrying or leased).
    pub pending: u64,
    pub dead: u64,
}

/// A sink's identity as a replica loaded it (see `crate::fleet`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SinkIdentity {
    pub name: String,
    /// Manifest `version`.
    pub version: String,
    /// Hex SHA-256 of the manifest and component bytes.
    pub component_sha: String,
}

/// A sink in the fleet's registry.
#[derive(Debug, Clone, Serialize)]
pub struct RegisteredSink {
    pub name: String,
    /// The identity it was first registered with.
    pub version: String,
    pub component_sha: String,
    /// Unix ms, database clock.
    pub registered_at_ms: i64,
    /// Set by `outboxd sinks retire`: no longer routed to.
    pub retired_at_ms: Option<i64>,
}

/// One replica's last report of a sink it serves.
#[derive(Debug, Clone, Serialize)]
pub struct SinkReplica {
    pub replica: String,
    pub sink: String,
    pub version: String,
    pub component_sha: String,
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
    Retry { delay: Duration, reason: String },
    /// Dead-letter it with `reason`. With `blocks_stream`, its stream stays
    /// blocked for this sink behind it until it is replayed or purged (its
    /// head is kept, due never); otherwise the stream moves on.
    Dead { reason: String, blocks_stream: bool },
    /// Give the lease back without charging the attempt: the delivery was
    /// not tried (an earlier event of its stream failed in the same batch).
    /// It becomes due again at once and waits for its predecessor.
    Release,
}

/// The durable store. Implementations: [`postgres::PgStore`],
/// [`sqlite::SqliteStore`].
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Store a request's events and their deliveries in one transaction.
    /// Returns one [`Ingested`] per item, in order. Either every new event
    /// is stored or, on error, none is.
    async fn ingest(&self, items: &[IngestItem]) -> Result<Vec<Ingested>, IngestError>;

    /// An event and its deliveries, by id.
    async fn event(&self, id: &str)
        -> Result<Option<(StoredEvent, Vec<DeliveryInfo>)>, StoreError>;

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
    /// still held.
    async fn finish_many(&self, items: &[(i64, &str, &Finish)]) -> Result<Vec<bool>, StoreError>;

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
    async fn queue_stats(&self, cap: u64) -> Result<QueueStats, StoreError>;

    /// Dead letters matching `filter`, newest first, at most `limit`.
    async fn list_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, StoreError>;

    /// Make up to `limit` matching dead letters pending again: attempts and
    /// retry window start afresh. Returns how many.
    async fn replay_dead(&self, filter: &DeadFilter, limit: u32) -> Result<u64, StoreError>;

    /// Delete up to `limit` matching dead letters. Returns how many.
    async fn purge_dead(&self, filter: &DeadFilter, limit: u32) -> Result<u64, StoreError>;

    /// Pause (nothing claimed, nothing lost) or resume a sink.
    async fn set_paused(&self, sink: &str, paused: bool) -> Result<(), StoreError>;

    /// Sinks currently paused.
    async fn paused_sinks(&self) -> Result<Vec<String>, StoreError>;

    /// Delete up to `limit` deliveries delivered more than `older_than` ago.
    /// Returns how many.
    async fn purge_delivered(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError>;

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
    ) -> Result<BackfillPage, StoreError>;

    /// Names of migrations not yet applied.
    async fn pending_migrations(&self) -> Result<Vec<String>, StoreError>;

    /// True when no migration was ever applied (a new, empty database).
    async fn is_uninitialised(&self) -> Result<bool, StoreError>;

    /// Apply pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Check that the database answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// The checkpoint source `source` (a `[sources.NAME]` name) last saved,
    /// as it saved it; `None` before its first save. A checkpoint is a
    /// shortcut for where to resume, never a reason to skip work.
    async fn source_checkpoint(&self, source: &str) -> Result<Option<String>, StoreError>;

    /// Save `checkpoint` as source `source`'s, replacing the previous one.
    async fn save_source_checkpoint(
        &self,
        source: &str,
        checkpoint: &str,
    ) -> Result<(), StoreError>;

    /// Every destination, by name.
    async fn destinations(&self) -> Result<Vec<DestinationRow>, StoreError>;

    /// Write destination `name` as `mode` allows. Returns the new revision,
    /// or `None` when `mode` refused (it exists on `Create`; another
    /// revision is stored on `Revision`).
    async fn put_destination(
        &self,
        name: &str,
        sink: &str,
        record: &str,
        mode: PutMode,
    ) -> Result<Option<i64>, StoreError>;

    /// Delete destination `name` and its health; its deliveries stay
    /// (parked under its name until one of that name exists again, or
    /// [`Store::purge_target`]). Returns whether it existed.
    async fn delete_destination(&self, name: &str) -> Result<bool, StoreError>;

    /// Delete every delivery of delivery key `key` that is not delivered
    /// (pending, retrying, leased and dead), and its heads, in one
    /// transaction.
    async fn purge_target(&self, key: &str) -> Result<Purged, StoreError>;

    /// The health record (host JSON) of every destination that has one.
    async fn destination_health(&self) -> Result<Vec<(String, String)>, StoreError>;

    /// Replace the health record of destination `name`.
    async fn save_destination_health(&self, name: &str, health: &str) -> Result<(), StoreError>;

    /// Register every sink of `sinks` not registered yet (a retired one
    /// stays retired). Returns the names newly registered.
    async fn register_sinks(&self, sinks: &[SinkIdentity]) -> Result<Vec<String>, StoreError>;

    /// The fleet's registry, by name.
    async fn registered_sinks(&self) -> Result<Vec<RegisteredSink>, StoreError>;

    /// Record that `replica` serves exactly `sinks` now (its earlier report
    /// is replaced; reports older than an hour, of any replica, deleted).
    async fn beat_replica(&self, replica: &str, sinks: &[SinkIdentity]) -> Result<(), StoreError>;

    /// Every replica's last report, by sink then replica.
    async fn sink_replicas(&self) -> Result<Vec<SinkReplica>, StoreError>;

    /// Retire sink `name`: no replica routes new events to it. Returns
    /// false when it is not registered or already retired.
    async fn retire_sink(&self, name: &str) -> Result<bool, StoreError>;
}

/// Open the store named by a database URL: `postgres://…` /
/// `postgresql://…`, or `sqlite://PATH`.
///
/// Errors: an unsupported scheme, or the database cannot be opened.
pub async fn open(url: &str) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(std::sync::Arc::new(postgres::PgStore::open(url).await?));
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
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &userinfo[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// The sequence `ev` (item `index` of its request) takes on a stream whose
/// last sequence is `last`: the producer's own, which must advance the
/// stream, or the next one.
pub(crate) fn next_sequence(index: usize, ev: &NewEvent, last: u64) -> Result<u64, IngestError> {
    match ev.sequence {
        Some(given) if given <= last => Err(IngestError::SequenceNotIncreasing {
            index,
            id: ev.id.clone(),
            stream: ev.stream.clone(),
            given,
            last,
        }),
        Some(given) => Ok(given),
        None => Ok(last + 1),
    }
}

/// A delivery row as a claim's update returned it.
pub(crate) struct LeasedRow {
    pub delivery_id: i64,
    pub event_id: String,
    pub attempts: u32,
    pub first_attempt_at_ms: i64,
    pub claimed_at_ms: i64,
}

/// Join leased rows with their events into the batch, in the order the
/// sink contract wants: by stream, then sequence.
pub(crate) fn assemble_claims(
    rows: Vec<LeasedRow>,
    events: &std::collections::BTreeMap<String, StoredEvent>,
    token: &str,
) -> Result<Vec<Claimed>, StoreError> {
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        let event = events.get(&row.event_id).cloned().ok_or_else(|| {
            StoreError::Corrupt(format!(
                "delivery refers to missing event {:?}",
                row.event_id
            ))
        })?;
        claimed.push(Claimed {
            delivery_id: row.delivery_id,
            lease_token: token.to_string(),
            attempts: row.attempts,
            first_attempt_at_ms: row.first_attempt_at_ms,
            claimed_at_ms: row.claimed_at_ms,
            event,
        });
    }
    claimed.sort_by(|a, b| {
        (a.event.event.stream.as_str(), a.event.sequence)
            .cmp(&(b.event.event.stream.as_str(), b.event.sequence))
    });
    Ok(claimed)
}

/// Whether `stored` and `new` (same id) are the same event: equal content
/// hashes, or — when the stored row has no hash (enqueued by SQL) — no
/// differing attribute. `Err` lists the attributes that differ.
pub(crate) fn same_event(
    stored_hash: Option<&str>,
    stored: &NewEvent,
    new: &NewEvent,
    new_hash: &str,
) -> Result<(), Vec<String>> {
    if stored_hash == Some(new_hash) {
        return Ok(());
    }
    let diff = new.differences(stored);
    if diff.is_empty() && stored_hash.is_none() {
        return Ok(());
    }
    if diff.is_empty() {
        return Err(vec!["content".to_string()]);
    }
    Err(diff)
}

/// Cut claim runs for a chained sink. `order` lists (stream, delivery id)
/// as claimed: heads first, then each stream's run in sequence order.
/// Each stream keeps its ids up to the first `blocked` one. Returns the
/// kept ids, the streams that kept their head, and the streams whose head
/// is held back.
pub(crate) fn cut_runs(
    order: &[(String, i64)],
    heads: &[(String, i64)],
    blocked: &std::collections::HashSet<i64>,
) -> (Vec<i64>, Vec<String>, Vec<String>) {
    let mut stopped = std::collections::HashSet::new();
    let mut kept = Vec::new();
    for (stream, id) in order {
        if stopped.contains(stream) {
            continue;
        }
        if blocked.contains(id) {
            stopped.insert(stream.clone());
            continue;
        }
        kept.push(*id);
    }
    let (held, claimed): (Vec<_>, Vec<_>) = heads.iter().partition(|(_, id)| blocked.contains(id));
    (
        kept,
        claimed.into_iter().map(|(s, _)| s.clone()).collect(),
        held.into_iter().map(|(s, _)| s.clone()).collect(),
    )
}

/// A `(name, sink, record, revision, updated_at)` row as a
/// [`DestinationRow`].
pub(crate) fn destination_row(
    (name, sink, record, revision, updated_at_ms): (String, String, String, i64, i64),
) -> DestinationRow {
    DestinationRow {
        name,
        sink,
        record,
        revision,
        updated_at_ms,
    }
}

/// A `(name, version, sha, registered_at, retired_at)` row.
pub(crate) fn registered_sink(
    (name, version, component_sha, registered_at_ms, retired_at_ms): (
        String,
        String,
        String,
        i64,
        Option<i64>,
    ),
) -> RegisteredSink {
    RegisteredSink {
        name,
        version,
        component_sha,
        registered_at_ms,
        retired_at_ms,
    }
}

/// A `(replica, sink, version, sha, age)` row.
pub(crate) fn sink_replica(
    (replica, sink, version, component_sha, age_ms): (String, String, String, String, i64),
) -> SinkReplica {
    SinkReplica {
        replica,
        sink,
        version,
        component_sha,
        age_ms,
    }
}

/// Random lease token: 128 bits as 32 hex digits.
pub(crate) fn new_lease_token() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// An event row as both stores select it (their `EVENT_COLUMNS`, the
/// ingest time as `ingested_at_ms`). Errors: a column missing or of
/// another type, extensions that are not a JSON object of strings.
pub(crate) fn event_from_row<'r, R>(row: &'r R) -> Result<StoredEvent, StoreError>
where
    R: sqlx::Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let extensions: String = row.try_get("extensions")?;
    let extensions: std::collections::BTreeMap<String, String> = serde_json::from_str(&extensions)
        .map_err(|e| StoreError::Corrupt(format!("events.extensions: {e}")))?;
    let sequence: i64 = row.try_get("sequence")?;
    let producer_sequence: bool = row.try_get("producer_sequence")?;
    let data_format: String = row.try_get("data_format")?;
    Ok(StoredEvent {
        event: NewEvent {
            id: row.try_get("id")?,
            source: row.try_get("source")?,
            ty: row.try_get("type")?,
            subject: row.try_get("subject")?,
            time: row.try_get("time")?,
            datacontenttype: row.try_get("datacontenttype")?,
            dataschema: row.try_get("dataschema")?,
            stream: row.try_get("stream")?,
            sequence: producer_sequence.then_some(sequence as u64),
            extensions,
            data: row.try_get("data")?,
            data_format: crate::event::DataFormat::parse(&data_format),
        },
        sequence: sequence as u64,
        ingested_at_ms: row.try_get("ingested_at_ms")?,
    })
}

/// A dead letter as both stores select it: event id, sink, stream,
/// sequence, attempts, last error, finished at (Unix ms).
pub(crate) type DeadRow = (
    String,
    String,
    String,
    i64,
    i64,
    Option<String>,
    Option<i64>,
);

/// [`DeadRow`]s as [`DeadLetter`]s.
pub(crate) fn dead_letters(rows: Vec<DeadRow>) -> Vec<DeadLetter> {
    rows.into_iter()
        .map(
            |(event_id, sink, stream, sequence, attempts, reason, died)| DeadLetter {
                event_id,
                sink,
                stream,
                sequence: sequence as u64,
                attempts: attempts as u32,
                reason,
                died_at_ms: died,
            },
        )
        .collect()
}

/// Fold (sink, status, count) rows and (sink, age) rows into figures.
pub(crate) fn fold_stats(
    rows: Vec<(String, String, i64)>,
    ages: Vec<(String, i64)>,
    cap: u64,
) -> QueueStats {
    let mut by_sink: std::collections::BTreeMap<String, SinkQueue> =
        std::collections::BTreeMap::new();
    let mut total = 0u64;
    for (sink, status, n) in rows {
        let q = by_sink.entry(sink.clone()).or_insert_with(|| SinkQueue {
            sink,
            ..Default::default()
        });
        let n = n.max(0) as u64;
        total += n;
        match status.as_str() {
            "dead" => q.dead += n,
            "leased" => q.leased += n,
            "expired" => q.expired_leases += n,
            "retrying" => q.retrying += n,
            _ => q.pending += n,
        }
    }
    for (sink, age) in ages {
        let q = by_sink.entry(sink.clone()).or_insert_with(|| SinkQueue {
            sink,
            ..Default::default()
        });
        q.oldest_due_age_ms = Some(age.max(0));
    }
    QueueStats {
        sinks: by_sink.into_values().collect(),
        capped: total >= cap,
    }
}
