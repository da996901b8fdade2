//! Routing: which sinks get a delivery of an event.
//!
//! Owns: matching an event's `type` and stream against the configured
//! routes, and checking at start that every route names a known sink.
//!
//! Must never: look at anything but the event's attributes (routing is
//! decided once, at ingest, inside the ingest transaction's input).

use std::sync::RwLock;

use crate::config::Route;
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
}

/// A route that names a sink no plugin manifest declares.
#[derive(Debug, thiserror::Error)]
#[error(
    "routes[{index}] names sink {sink:?}, which no plugin manifest declares (known sinks: {known})"
)]
pub struct UnknownSink {
    pub index: usize,
    pub sink: String,
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
        })
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

    /// The sinks `event` goes to, sorted, without repeats.
    pub fn sinks_for(&self, event: &NewEvent) -> Vec<String> {
        let Some(routes) = &self.routes else {
            return self.sinks.read().unwrap_or_else(|e| e.into_inner()).clone();
        };
        let mut out: Vec<String> = routes
            .iter()
            .filter(|r| r.types.iter().any(|p| glob_match(p, &event.ty)))
            .filter(|r| r.streams.iter().any(|p| glob_match(p, &event.stream)))
            .flat_map(|r| r.sinks.iter().cloned())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}
