//! The sink actions: list, pause, resume, retire, and backfill
//! (`/v1/admin/sinks…`, `/v1/admin/backfill`, `outboxd sinks …`,
//! `outboxd backfill`).
//!
//! Owns: the one view of a sink ([`SinkView`]: its state here, in the
//! fleet, paused or not), the view of the fleet's registry alone
//! ([`RegisteredSink`], for `sinks list --offline`), the rule that a sink
//! acted on must be one the caller knows, and backfill (deliveries for
//! past events, by the routes).
//!
//! Must never: drop a queued delivery (a pause claims nothing, a retire
//! stops new routing only), or route past events other than by the
//! routes.

use serde::{Deserialize, Serialize};

use super::{listed, AdminError};
use crate::delivery::quarantine::QuarantineState;
use crate::plugin::registry::{Registry, SinkState, REMOVED_REASON};
use crate::store::{SinkReplica, Store};

/// Where a sink stands in this daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkStatus {
    /// A version of it is loaded and claims.
    Loaded,
    /// Loaded, but claiming nothing until its quarantine ends.
    Quarantined,
    /// Its manifest is gone; its deliveries wait, parked.
    Removed,
    /// A manifest names it but it never loaded.
    Refused,
    /// Registered by another replica, not loaded here.
    Elsewhere,
}

impl SinkStatus {
    /// The word the API and the CLI show (`loaded`, `quarantined`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            SinkStatus::Loaded => "loaded",
            SinkStatus::Quarantined => "quarantined",
            SinkStatus::Removed => "removed",
            SinkStatus::Refused => "refused",
            SinkStatus::Elsewhere => "elsewhere",
        }
    }
}

/// One sink as `GET /v1/admin/sinks` answers and `outboxd sinks list`
/// prints it.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    pub state: SinkStatus,
    /// The manifest version loaded here.
    pub version: Option<String>,
    /// The hex SHA-256 of the `.wasm` file loaded here, as `sha256sum`
    /// prints it (`None` for a builtin sink or one not loaded here): the
    /// same figure as this replica's `replicas[].component_sha`.
    pub wasm_sha256: Option<String>,
    /// Why the last version offered was refused, while it is: a loaded
    /// sink keeps serving its running version (state `loaded`), one never
    /// loaded is `refused`.
    pub refused: Option<String>,
    /// Paused by an operator.
    pub paused: bool,
    /// Why its deliveries wait, when they do.
    pub parked: Option<String>,
    /// Its quarantine, while quarantined.
    pub quarantine: Option<QuarantineState>,
    /// In the store's sink registry.
    pub registered: bool,
    /// Retired: no longer routed to.
    pub retired: bool,
    /// Registered, not retired, and no replica serves it.
    pub unserved: bool,
    /// The replicas that reported serving it.
    pub replicas: Vec<SinkReplica>,
    /// Replicas run different components of it, or one component under
    /// different manifests (`replicas[].component_sha`,
    /// `replicas[].manifest_sha`).
    pub version_skew: bool,
}

/// The answer of `GET /v1/admin/sinks`: every sink and this replica's id.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sinks {
    /// By name.
    pub sinks: Vec<SinkView>,
    /// The replica that answered.
    pub replica: String,
}

/// Every sink this daemon knows or the fleet has registered, by name, and
/// this replica's id.
pub async fn list_sinks(
    store: &dyn Store,
    plugins: &Registry,
    quarantines: &crate::delivery::Quarantines,
    fleet: &crate::fleet::Fleet,
) -> Result<Sinks, AdminError> {
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
                    (true, SinkStatus::Quarantined, Some(version.clone()), None)
                }
                Some(SinkState::Loaded { version }) => {
                    (true, SinkStatus::Loaded, Some(version.clone()), None)
                }
                Some(SinkState::Removed) => (
                    false,
                    SinkStatus::Removed,
                    None,
                    Some(REMOVED_REASON.to_string()),
                ),
                None if known.contains(&sink) => (false, SinkStatus::Refused, None, None),
                None => (false, SinkStatus::Elsewhere, None, None),
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
    Ok(Sinks {
        sinks,
        replica: fleet.replica,
    })
}

/// A sink as the fleet's registry in the database has it, without a
/// daemon (`outboxd sinks list --offline`): what is loaded where is not
/// in the database.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisteredSink {
    /// The sink's name.
    pub sink: String,
    /// Paused by an operator.
    pub paused: bool,
    /// Retired: no longer routed to.
    pub retired: bool,
    /// The version it was first registered with.
    pub version: String,
}

/// Every sink in the fleet's registry, retired ones included.
pub async fn registered(store: &dyn Store) -> Result<Vec<RegisteredSink>, AdminError> {
    let paused = store.paused_sinks().await?;
    Ok(store
        .registered_sinks()
        .await?
        .into_iter()
        .map(|s| RegisteredSink {
            paused: paused.contains(&s.name),
            retired: s.retired_at_ms.is_some(),
            version: s.version,
            sink: s.name,
        })
        .collect())
}

/// The answer of a pause or resume: `{"sink", "paused"}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SinkPaused {
    /// The sink.
    pub sink: String,
    /// Paused now (false: resumed).
    pub paused: bool,
}

/// Pause (`paused`) or resume `sink` for every replica. `known` are the
/// sink names the caller may act on (a daemon: every sink it has seen;
/// `--offline`: the fleet's registry, [`registered`]).
///
/// Errors: [`AdminError::NotFound`] when `sink` is not in `known`.
pub async fn set_paused(
    store: &dyn Store,
    known: &[String],
    sink: &str,
    paused: bool,
) -> Result<SinkPaused, AdminError> {
    check_known(known, sink)?;
    store.set_paused(sink, paused).await?;
    Ok(SinkPaused {
        sink: sink.to_string(),
        paused,
    })
}

/// The answer of a retire: `{"sink", "retired": true}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SinkRetired {
    /// The sink.
    pub sink: String,
    /// Always true.
    pub retired: bool,
}

/// Retire `sink` from the fleet's registry: no replica routes new events
/// to it once it has read the registry again; deliveries already queued
/// stay.
///
/// Errors: [`AdminError::NotFound`] when it is not registered, or retired
/// already.
pub async fn retire(store: &dyn Store, sink: &str) -> Result<SinkRetired, AdminError> {
    if store.retire_sink(sink).await? {
        Ok(SinkRetired {
            sink: sink.to_string(),
            retired: true,
        })
    } else {
        Err(AdminError::NotFound(format!(
            "no registered sink {sink:?} that is not retired already"
        )))
    }
}

/// What `POST /v1/admin/backfill` is given.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    /// The sink to backfill.
    pub sink: String,
    /// Events ingested at or after this time, Unix ms. Default: all.
    #[serde(default)]
    pub since_ms: i64,
}

/// What a backfill did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Backfilled {
    /// The sink backfilled.
    pub sink: String,
    /// Events looked at.
    pub scanned: u64,
    /// Deliveries created (none for events that had one already).
    pub created: u64,
}

/// Create deliveries to the sink for the events ingested at or after
/// `since_ms` (Unix ms) that `routes` send to it; running it again creates
/// nothing new. The caller wakes the loops it can reach.
///
/// Errors: [`AdminError::NotFound`] when the sink is not in `known`.
pub async fn backfill(
    store: &dyn Store,
    routes: &crate::routing::routes::Router,
    known: &[String],
    req: &BackfillRequest,
) -> Result<Backfilled, AdminError> {
    check_known(known, &req.sink)?;
    let (scanned, created) =
        crate::routing::routes::backfill(store, routes, &req.sink, req.since_ms).await?;
    Ok(Backfilled {
        sink: req.sink.clone(),
        scanned,
        created,
    })
}

/// [`AdminError::NotFound`] unless `sink` is one of `known`, naming them.
fn check_known(known: &[String], sink: &str) -> Result<(), AdminError> {
    if known.iter().any(|k| k == sink) {
        Ok(())
    } else {
        Err(AdminError::NotFound(format!(
            "no sink named {sink:?} (known: {})",
            listed(known)
        )))
    }
}

/// Queue figures per delivery key (`GET /v1/admin/queue`, the console's
/// overview): live and dead deliveries counted up to
/// [`crate::store::STATS_COUNT_CAP`], and how long each key's oldest due
/// head has waited.
pub async fn queue(store: &dyn Store) -> Result<crate::store::QueueStats, AdminError> {
    Ok(store.queue_stats(crate::store::STATS_COUNT_CAP).await?)
}
