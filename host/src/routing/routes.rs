//! The route table: which delivery keys get a delivery of an event.
//!
//! Owns: matching an event's `type` and stream against the configured
//! routes, checking at start that every route names a known sink, and
//! expanding each routed sink into its destinations whose filters match
//! ([`Snapshot::expand`]; a sink without destinations
//! is its own key); [`backfill`] over past events by the same rule.
//!
//! Must never: look at anything but the event's attributes (routing is
//! decided once, at ingest, inside the ingest transaction's input).

use std::sync::{Arc, RwLock};

use tokio::sync::watch;

use super::settings::Route;
use super::Snapshot;
use crate::event::{glob_match, NewEvent};

/// The routing table.
#[derive(Debug)]
pub struct Router {
    /// `None`: no routes configured, every event goes to every sink.
    routes: Option<Vec<Route>>,
    /// Every sink seen since start. A plugin added while running joins;
    /// one removed stays, so events keep waiting for it rather than being
    /// routed nowhere.
    sinks: RwLock<Vec<String>>,
    /// The destinations, as the daemon last read them (empty without).
    destinations: watch::Receiver<Arc<Snapshot>>,
    /// The fleet's registry as last read (`crate::fleet`): sinks routed to
    /// though this process has not loaded them, and sinks retired.
    registered: RwLock<Registered>,
}

/// The fleet's registry, as routing needs it.
#[derive(Debug, Default, Clone)]
struct Registered {
    routable: Vec<String>,
    retired: Vec<String>,
}

/// A route that names a sink no plugin manifest declares.
#[derive(Debug, thiserror::Error)]
#[error(
    "routes[{index}] names sink {sink:?}, which no plugin manifest declares (known sinks: {known})"
)]
pub struct UnknownSink {
    /// Which `[[routes]]` entry, from 0.
    pub index: usize,
    /// The sink it names.
    pub sink: String,
    /// The sinks the loaded manifests declare, comma-separated.
    pub known: String,
}

impl Router {
    /// Build the table over the known sink names. Errors name the route.
    pub fn new(routes: Option<Vec<Route>>, sinks: Vec<String>) -> Result<Router, UnknownSink> {
        if let Some(routes) = &routes {
            for (index, route) in routes.iter().enumerate() {
                for sink in &route.sinks {
                    if !sinks.contains(sink) {
                        return Err(UnknownSink {
                            index,
                            sink: sink.clone(),
                            known: if sinks.is_empty() {
                                "none".into()
                            } else {
                                sinks.join(", ")
                            },
                        });
                    }
                }
            }
        }
        Ok(Router {
            routes,
            sinks: RwLock::new(sinks),
            destinations: watch::channel(Arc::new(Snapshot::default())).1,
            registered: RwLock::default(),
        })
    }

    /// Route by the destinations `snapshot` follows too.
    pub fn with_destinations(mut self, snapshot: watch::Receiver<Arc<Snapshot>>) -> Router {
        self.destinations = snapshot;
        self
    }

    /// A sink loaded while running. Without configured routes it gets every
    /// event from now on; with routes, only if a route already names it.
    /// Returns whether any route (or the default "every sink") sends it
    /// events.
    pub fn add_sink(&self, sink: &str) -> bool {
        let mut sinks = self.sinks.write().unwrap_or_else(|e| e.into_inner());
        if !sinks.iter().any(|s| s == sink) {
            sinks.push(sink.to_string());
            sinks.sort();
        }
        match &self.routes {
            None => true,
            Some(routes) => routes.iter().any(|r| r.sinks.iter().any(|s| s == sink)),
        }
    }

    /// Route by the fleet's registry from now on: without routes, every
    /// sink in `routable` gets events though this process has not loaded
    /// it; no sink in `retired` gets new events.
    pub fn set_registered(&self, routable: Vec<String>, retired: Vec<String>) {
        *self.registered.write().unwrap_or_else(|e| e.into_inner()) =
            Registered { routable, retired };
    }

    /// The delivery keys `event` goes to — sinks, and destinations in
    /// place of the sinks that have them — sorted, without repeats.
    pub fn sinks_for(&self, event: &NewEvent) -> Vec<String> {
        let snapshot = self.destinations.borrow().clone();
        snapshot.expand(self.routed_sinks(event, &snapshot), event)
    }

    /// The sinks `event` is routed to. Without routes: every sink this
    /// process has loaded, and every sink a stored destination names (the
    /// destinations are shared by every replica, the plugins folder is not).
    fn routed_sinks(&self, event: &NewEvent, snapshot: &Snapshot) -> Vec<String> {
        let registered = self.registered.read().unwrap_or_else(|e| e.into_inner());
        let Some(routes) = &self.routes else {
            let mut sinks = self.sinks.read().unwrap_or_else(|e| e.into_inner()).clone();
            sinks.extend(snapshot.by_sink.keys().cloned());
            sinks.extend(registered.routable.iter().cloned());
            sinks.retain(|s| !registered.retired.contains(s));
            sinks.sort();
            sinks.dedup();
            return sinks;
        };
        let mut out: Vec<String> = routes
            .iter()
            .filter(|r| r.types.iter().any(|p| glob_match(p, &event.ty)))
            .filter(|r| r.streams.iter().any(|p| glob_match(p, &event.stream)))
            .flat_map(|r| r.sinks.iter().cloned())
            .filter(|s| !registered.retired.contains(s))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// Events per backfill page (one transaction each).
pub const BACKFILL_PAGE: u32 = 500;

/// Backfill delivery key `sink` (a sink, or a destination) over every event since `since_ms`, page by page.
/// Returns (events scanned, deliveries created). Running it twice creates
/// nothing the second time.
pub async fn backfill(
    store: &dyn crate::store::Store,
    routes: &Router,
    sink: &str,
    since_ms: i64,
) -> Result<(u64, u64), crate::store::StoreError> {
    let route = |e: &crate::event::NewEvent| routes.sinks_for(e);
    let (mut scanned, mut created, mut after) = (0, 0, 0);
    loop {
        let page = store
            .backfill_page(sink, since_ms, after, BACKFILL_PAGE, &route)
            .await?;
        scanned += page.scanned;
        created += page.created;
        match page.next_after {
            Some(next) => after = next,
            None => return Ok((scanned, created)),
        }
    }
}
