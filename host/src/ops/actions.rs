//! The admin actions on events, dead letters and sinks, shared by the HTTP
//! admin API ([`super::admin`], under `/v1/admin/`) and the CLI (`outboxd
//! events|dead|sinks|backfill|config`).
//!
//! Owns: the one JSON shape of an event as the admin reads it
//! ([`EventView`]); the one dead-letter selection rule ([`DeadSelection`]:
//! `limit` defaults to [`DEAD_LIST_DEFAULT`] for a listing and to
//! [`DEAD_PAGE_MAX`] for a replay or purge, and is refused above
//! [`DEAD_PAGE_MAX`]); reading the RFC 3339 times of admin input
//! ([`parse_time`]); the sink views and changes (pause, resume, retire);
//! backfill; and the configuration as shown (secrets redacted).
//!
//! Must never: print, or know HTTP beyond the status an error maps to
//! ([`AdminError::status`]); change anything beyond what the action's name
//! says; show a secret.

use serde::Serialize;

use crate::config::Config;
pub use crate::limits::{DEAD_LIST_DEFAULT, DEAD_PAGE_MAX};
use crate::plugin::registry::{Registry, SinkState, REMOVED_REASON};
use crate::store::{DeadFilter, DeadLetter, DeliveryInfo, SinkReplica, Store, StoreError};

/// Why an admin action did nothing.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Bad input (HTTP 400), naming the field or flag.
    #[error("{field}: {message}")]
    Invalid {
        /// The field or flag, as the user wrote it.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// What the action names does not exist (HTTP 404); the message says
    /// what was looked for.
    #[error("{0}")]
    NotFound(String),
    /// What the action would create exists already, or changed while it
    /// ran (HTTP 409); the message says what.
    #[error("{0}")]
    Conflict(String),
    /// The database failed (HTTP 503).
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

impl AdminError {
    /// The HTTP status it answers with.
    pub fn status(&self) -> u16 {
        match self {
            AdminError::Invalid { .. } => 400,
            AdminError::NotFound(_) => 404,
            AdminError::Conflict(_) => 409,
            AdminError::Store(_) => 503,
        }
    }
}

/// `text` as an RFC 3339 time, in Unix milliseconds.
///
/// Errors: [`AdminError::Invalid`] naming `field` (a flag such as
/// `--since`, or a JSON field) and the text given.
pub fn parse_time(field: &str, text: &str) -> Result<i64, AdminError> {
    crate::rfc3339::parse_ms(text).map_err(|message| AdminError::Invalid {
        field: field.to_string(),
        message,
    })
}

/// An event and its deliveries, as `GET /v1/admin/events/{id}` answers and
/// `outboxd events show ID` prints (the same JSON). The payload itself is
/// not shown, only its size (`GET /v1/events/{id}` gives the event whole).
#[derive(Debug, Clone, Serialize)]
pub struct EventView {
    /// The event's id.
    pub id: String,
    /// CloudEvents `source`.
    pub source: String,
    #[serde(rename = "type")]
    /// CloudEvents `type`.
    pub ty: String,
    /// CloudEvents `subject`.
    pub subject: Option<String>,
    /// The ordering stream (CloudEvents `partitionkey`).
    pub stream: String,
    /// Position in its stream.
    pub sequence: u64,
    /// The producer's `time`, as given.
    pub time: Option<String>,
    /// CloudEvents `datacontenttype`.
    pub datacontenttype: Option<String>,
    /// Commit time of the ingest, Unix ms.
    pub ingested_at_ms: i64,
    /// Size of `data`, bytes.
    pub data_bytes: usize,
    /// The authenticated producer that posted it (`None`: anonymous, a
    /// source, or the in-transaction outbox).
    pub producer: Option<String>,
    /// Its deliveries, by delivery key.
    pub deliveries: Vec<DeliveryInfo>,
}

/// Event `id` with its deliveries.
///
/// Errors: [`AdminError::NotFound`] when no event has that id.
pub async fn show_event(store: &dyn Store, id: &str) -> Result<EventView, AdminError> {
    let (stored, deliveries) = store
        .event(id)
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("no event with id {id:?}")))?;
    let producer = store.event_producer(id).await?;
    let ev = stored.event;
    Ok(EventView {
        id: ev.id,
        source: ev.source,
        ty: ev.ty,
        subject: ev.subject,
        stream: ev.stream,
        sequence: stored.sequence,
        time: ev.time,
        datacontenttype: ev.datacontenttype,
        ingested_at_ms: stored.ingested_at_ms,
        data_bytes: ev.data.len(),
        producer,
        deliveries,
    })
}

/// Which dead letters an action applies to, and at most how many.
#[derive(Debug, Clone, Default)]
pub struct DeadSelection {
    /// Every given field must match; none given matches all.
    pub filter: DeadFilter,
    /// `None`: [`DEAD_LIST_DEFAULT`] for a listing, [`DEAD_PAGE_MAX`] for a
    /// replay or purge. Refused when 0 or above [`DEAD_PAGE_MAX`].
    pub limit: Option<u32>,
}

impl DeadSelection {
    fn limit(&self, default: u32) -> Result<u32, AdminError> {
        match self.limit.unwrap_or(default) {
            n @ 1..=DEAD_PAGE_MAX => Ok(n),
            n => Err(AdminError::Invalid {
                field: "limit".into(),
                message: format!(
                    "must be 1 to {DEAD_PAGE_MAX} (the most one request takes; repeat it for more), got {n}"
                ),
            }),
        }
    }
}

/// The matching dead letters, newest first.
pub async fn list_dead(
    store: &dyn Store,
    sel: &DeadSelection,
) -> Result<Vec<DeadLetter>, AdminError> {
    Ok(store
        .list_dead(&sel.filter, sel.limit(DEAD_LIST_DEFAULT)?)
        .await?)
}

/// Make the matching dead letters pending again (attempts and retry window
/// start afresh). Returns how many. The caller wakes the delivery loops it
/// can reach; others find the work at their next poll.
pub async fn replay_dead(store: &dyn Store, sel: &DeadSelection) -> Result<u64, AdminError> {
    Ok(store
        .replay_dead(&sel.filter, sel.limit(DEAD_PAGE_MAX)?)
        .await?)
}

/// Delete the matching dead letters. Returns how many. A purged dead
/// letter may unblock its stream (`on-dead = block`): the caller wakes the
/// loops it can reach.
pub async fn purge_dead(store: &dyn Store, sel: &DeadSelection) -> Result<u64, AdminError> {
    Ok(store
        .purge_dead(&sel.filter, sel.limit(DEAD_PAGE_MAX)?)
        .await?)
}

/// Pause (`paused`) or resume `sink` for every replica. `known` are the
/// sink names the caller may act on (a daemon: every sink it has seen; the
/// CLI: the fleet's registry).
///
/// Errors: [`AdminError::NotFound`] when `sink` is not in `known`.
pub async fn set_paused(
    store: &dyn Store,
    known: &[String],
    sink: &str,
    paused: bool,
) -> Result<(), AdminError> {
    if !known.iter().any(|k| k == sink) {
        return Err(AdminError::NotFound(format!(
            "no sink named {sink:?} (known: {})",
            listed(known)
        )));
    }
    Ok(store.set_paused(sink, paused).await?)
}

/// The sink names in the fleet's registry, retired ones included: what the
/// CLI, which loads no plugins, may pause or resume.
pub async fn registered_sinks(store: &dyn Store) -> Result<Vec<String>, AdminError> {
    Ok(store
        .registered_sinks()
        .await?
        .into_iter()
        .map(|s| s.name)
        .collect())
}

/// Retire `sink` from the fleet's registry: no replica routes new events
/// to it once it has read the registry again; deliveries already queued
/// stay.
///
/// Errors: [`AdminError::NotFound`] when it is not registered, or retired
/// already.
pub async fn retire(store: &dyn Store, sink: &str) -> Result<(), AdminError> {
    if store.retire_sink(sink).await? {
        Ok(())
    } else {
        Err(AdminError::NotFound(format!(
            "no registered sink {sink:?} that is not retired already"
        )))
    }
}

/// What a backfill did.
#[derive(Debug, Clone, Serialize)]
pub struct Backfilled {
    /// The sink backfilled.
    pub sink: String,
    /// Events looked at.
    pub scanned: u64,
    /// Deliveries created (none for events that had one already).
    pub created: u64,
}

/// Create deliveries to `sink` for the events ingested at or after
/// `since_ms` (Unix ms) that `routes` send to it; running it again creates
/// nothing new.
///
/// Errors: [`AdminError::NotFound`] when `sink` is not in `known`.
pub async fn backfill(
    store: &dyn Store,
    routes: &crate::routing::routes::Router,
    known: &[String],
    sink: &str,
    since_ms: i64,
) -> Result<Backfilled, AdminError> {
    if !known.iter().any(|k| k == sink) {
        return Err(AdminError::NotFound(format!(
            "no sink named {sink:?} (known: {})",
            listed(known)
        )));
    }
    let (scanned, created) =
        crate::routing::routes::backfill(store, routes, sink, since_ms).await?;
    Ok(Backfilled {
        sink: sink.to_string(),
        scanned,
        created,
    })
}

/// One sink as `GET /v1/admin/sinks` answers and `outboxd sinks list`
/// prints it.
#[derive(Debug, Clone, Serialize)]
pub struct SinkView {
    /// The sink's name.
    pub sink: String,
    /// A version of it is loaded here.
    pub loaded: bool,
    /// `loaded`; `quarantined` (loaded, but claiming nothing until
    /// `quarantine.until_ms` after failing batch after batch;
    /// `quarantine.reason` says how); `removed` (its manifest is gone; its
    /// deliveries wait, parked with reason `parked`, until it returns);
    /// `refused` (a manifest names it but it never loaded); `elsewhere`
    /// (registered by another replica, not loaded here).
    pub state: &'static str,
    /// The manifest version loaded here.
    pub version: Option<String>,
    /// The hex SHA-256 of the `.wasm` file loaded here, as `sha256sum`
    /// prints it (`None` for a builtin sink or one not loaded here). The
    /// fleet's `replicas[].component_sha` is another figure: it covers the
    /// manifest too.
    pub wasm_sha256: Option<String>,
    /// Why the last version offered was refused, while it is: a loaded
    /// sink keeps serving its running version (state `loaded`), one never
    /// loaded is `refused`.
    pub refused: Option<String>,
    /// Paused by an operator.
    pub paused: bool,
    /// Why its deliveries wait, when they do.
    pub parked: Option<&'static str>,
    /// Its quarantine, while quarantined.
    pub quarantine: Option<crate::delivery::quarantine::QuarantineState>,
    /// In the store's sink registry.
    pub registered: bool,
    /// Retired: no longer routed to.
    pub retired: bool,
    /// Registered, not retired, and no replica serves it.
    pub unserved: bool,
    /// The replicas that reported serving it.
    pub replicas: Vec<SinkReplica>,
    /// Replicas run different components of it.
    pub version_skew: bool,
}

/// Every sink this daemon knows or the fleet has registered, by name, and
/// this replica's id.
pub async fn list_sinks(
    store: &dyn Store,
    plugins: &Registry,
    quarantines: &crate::delivery::Quarantines,
    fleet: &crate::fleet::Fleet,
) -> Result<(Vec<SinkView>, String), AdminError> {
    let paused = store.paused_sinks().await?;
    let states = plugins.states();
    let mut refusals = plugins.refusals();
    let mut wasm_sha256s = plugins.wasm_sha256s();
    let mut quarantined = quarantines.current();
    let fleet = fleet.status();
    let known = plugins.known();
    let mut names = known.clone();
    names.extend(fleet.sinks.iter().map(|s| s.name.clone()));
    names.sort();
    names.dedup();
    let sinks = names
        .into_iter()
        .map(|sink| {
            let f = fleet.sinks.iter().find(|f| f.name == sink);
            let quarantine = quarantined.remove(&sink);
            let (loaded, state, version, parked) = match states.get(&sink) {
                Some(SinkState::Loaded { version }) if quarantine.is_some() => {
                    (true, "quarantined", Some(version.clone()), None)
                }
                Some(SinkState::Loaded { version }) => {
                    (true, "loaded", Some(version.clone()), None)
                }
                Some(SinkState::Removed) => (false, "removed", None, Some(REMOVED_REASON)),
                None if known.contains(&sink) => (false, "refused", None, None),
                None => (false, "elsewhere", None, None),
            };
            SinkView {
                loaded,
                state,
                version,
                wasm_sha256: wasm_sha256s.remove(&sink),
                refused: refusals.remove(&sink),
                paused: paused.contains(&sink),
                parked,
                quarantine,
                registered: f.is_some_and(|f| f.registered),
                retired: f.is_some_and(|f| f.retired),
                unserved: f.is_some_and(|f| f.unserved),
                replicas: f.map(|f| f.replicas.clone()).unwrap_or_default(),
                version_skew: f.is_some_and(|f| f.versions.len() > 1),
                sink,
            }
        })
        .collect();
    Ok((sinks, fleet.replica))
}

/// `config` as `outboxd config show` prints it: the admin token, the
/// secrets key (`secrets.key`), the database password and every source's and the awareness ingest's
/// secrets replaced by `***`.
pub fn shown_config(mut config: Config) -> Config {
    if config.admin.token.is_some() {
        config.admin.token = Some("***".into());
    }
    if config.secrets.key.is_some() {
        config.secrets.key = Some("***".into());
    }
    config.database_url = config.database_url.as_deref().map(crate::store::redact_url);
    for source in config.sources.values_mut() {
        *source = source.redacted();
    }
    if let Some(awareness) = config.ingest.awareness.as_mut() {
        *awareness = awareness.redacted();
    }
    config
}

/// `names` joined for an error message.
fn listed(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}
