//! The delivery engine: claim → call the sink → fenced finish.
//!
//! Owns, one room each: the loop of one delivery key and its schedule
//! ([`sink_loop`]), one turn of it ([`turn`]), the translation of outcomes
//! into delivered / retry at T / dead ([`retry`]), quarantine of a plugin
//! whose batches keep failing as a whole ([`quarantine`]), liveness
//! ([`heartbeat`]), pauses ([`paused`]), what a key is served by
//! ([`target`]), the router of events enqueued by SQL ([`router`]),
//! retention ([`retention`]) and its settings ([`settings`]). Here: what
//! they all share.
//!
//! Invariants kept here: no in-memory "running" latch — a turn that fails
//! logs, backs off and tries again; every database call has a timeout; the
//! plugin call has the manifest's deadline; a lost lease changes nothing.
//!
//! Must never: hold a lease while sleeping, or mark delivered anything the
//! sink did not acknowledge.

pub mod heartbeat;
pub mod paused;
pub mod quarantine;
mod retention;
pub mod retry;
mod router;
pub mod settings;
mod sink_loop;
pub mod target;
mod turn;

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::Metrics;
use crate::store::Store;
pub use heartbeat::Heartbeats;
pub use quarantine::Quarantines;
pub use retention::run_retention;
pub use router::{run_router, RouteFn};
use settings::DeliveryConfig;
pub use sink_loop::run_sink;
pub use target::{Target, TurnObserver};

/// The minimum lease for a sink with deadline `d`: `2·d + 5 s`. A lease
/// shorter than this could expire while the batch is still running and let
/// another worker deliver the same events concurrently. Because a batch can
/// never outlive its deadline (the plugin call is interrupted there, the
/// turn abandoned), a lease of at least this length never needs renewing.
pub fn minimum_lease(deadline: Duration) -> Duration {
    deadline * 2 + Duration::from_secs(5)
}

/// What every sink loop shares.
#[derive(Clone)]
pub struct Shared {
    /// The durable store.
    pub store: Arc<dyn Store>,
    /// The `[delivery]` settings.
    pub config: DeliveryConfig,
    /// Woken on ingest, per delivery key (and by LISTEN/NOTIFY from other
    /// processes).
    pub wake: Arc<crate::wakeups::Wakeups>,
    /// Each loop's liveness, for `/health` and `/ready`.
    pub heartbeats: Arc<Heartbeats>,
    /// The Prometheus registry.
    pub metrics: Arc<Metrics>,
    /// Which sinks are quarantined (shown by `/ready` and the admin API).
    pub quarantines: Arc<Quarantines>,
    /// Which sinks an operator paused (one read per second for every loop).
    pub paused: Arc<paused::PausedSinks>,
    /// The tracer: a span per claim, attempt and finish when on.
    pub telemetry: crate::otel::Telemetry,
}

/// The stale limit of a sink's loop: its longest healthy turn (plugin
/// deadline plus three database calls) plus the longest idle sleep, plus
/// 5 s of slack.
pub fn stale_after(config: &DeliveryConfig, deadline: Duration) -> Duration {
    deadline + config.db_timeout * 3 + config.max_poll_interval + Duration::from_secs(5)
}
