//! The destination record as routing reads it, and the [`Snapshot`] of
//! every destination each replica routes by.
//!
//! A destination's name is its **delivery key**; its sink and [`Filter`]
//! decide which events it gets a delivery of ([`Snapshot::expand`]). The
//! record is kept whole here (the store keeps its JSON whole), its secrets
//! included: what is done with them — redaction before a record leaves the
//! process, the configuration handed to its plugin — is
//! `crate::destinations`'.
//!
//! Must never: print a record (only `Destination::redacted` leaves the
//! process), or route by anything but the event's attributes.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Filter;
use crate::event::NewEvent;

/// Whether an operator or outboxd itself has stopped a destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Delivering.
    #[default]
    Active,
    /// Stopped by an operator; deliveries wait (still queued at ingest).
    Paused,
    /// Stopped by outboxd after every attempt failed for
    /// `destinations.disable-after`; deliveries wait; `resume` re-enables.
    Disabled,
}

/// A destination's retry schedule, in place of its manifest's; each
/// duration at most the manifest's own (the manifest bounds what its
/// destinations may ask for).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryOverride {
    /// Delay after the first failure (`"2s"`).
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub base: Option<Duration>,
    /// Longest delay.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub cap: Option<Duration>,
    /// How long retries go on after the first attempt before dead-lettering.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub window: Option<Duration>,
}

/// A destination as stored (the store keeps this JSON whole).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Destination {
    /// Unique; also its delivery key.
    pub name: String,
    /// The plugin (manifest `name`) that serves it.
    pub sink: String,
    /// Key/value pairs merged over the manifest's `[config]` for `init`
    /// (never `secret`: that is [`Destination::secret`]). A credential
    /// value (`crate::secrets::is_credential`) is stored sealed
    /// (`enc:v1:…`, see `crate::destinations::sealing`).
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    #[serde(default)]
    /// Which events it takes (types, streams, `where`).
    pub filter: Filter,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// A retry policy within the manifest's bounds.
    pub retry: Option<RetryOverride>,
    /// Events per second handed to the plugin, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<u32>,
    /// Events in one batch (so in flight at once), at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    #[serde(default)]
    /// Active, paused by an operator, or disabled after failing.
    pub state: State,
    /// Why it is paused or disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_reason: Option<String>,
    /// The signing secret given to the plugin as config `secret`; `None`
    /// for a destination without one. Stored (and held in the live
    /// snapshot) sealed, `enc:v1:<key-id>:…`; plain only in a database
    /// written without a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The secret before the last rotation, given as config
    /// `previous-secret` until `previous_until_ms` (Unix ms); sealed as
    /// `secret` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Until when (Unix ms) the previous secret still signs too.
    pub previous_until_ms: Option<i64>,
    /// Unix ms.
    #[serde(default)]
    pub created_at_ms: i64,
    /// Who keeps it: `sync` for one created by a platform sync
    /// (`crate::ops::actions::sync`), which may pause it when its platform
    /// leaves the list; `None` for one made by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_by: Option<String>,
}

/// The destinations every replica routes by, as last read from the store.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// By name.
    pub by_name: BTreeMap<String, Destination>,
    /// Store revision of each, by name: what a refresh compares.
    pub revisions: BTreeMap<String, i64>,
    /// Names of the destinations of each sink (routing looks a sink up
    /// here for every event, rather than scanning every destination).
    pub by_sink: BTreeMap<String, Vec<String>>,
}

impl Snapshot {
    /// The delivery keys for `event` routed to `sinks`: a sink with
    /// destinations expands to those whose filters match it (whatever their
    /// state: a paused or disabled destination still queues, and delivers
    /// once resumed); a sink without destinations is its own key. Sorted,
    /// without repeats.
    pub fn expand(&self, sinks: Vec<String>, event: &NewEvent) -> Vec<String> {
        if self.by_name.is_empty() {
            return sinks;
        }
        let mut keys = Vec::with_capacity(sinks.len());
        for sink in sinks {
            if !self.by_sink.contains_key(&sink) {
                keys.push(sink);
                continue;
            }
            keys.extend(
                self.of_sink(&sink)
                    .filter(|d| d.filter.matches(event))
                    .map(|d| d.name.clone()),
            );
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// The destinations of `sink`.
    pub fn of_sink<'s>(&'s self, sink: &str) -> impl Iterator<Item = &'s Destination> + 's {
        self.by_sink
            .get(sink)
            .into_iter()
            .flatten()
            .filter_map(|name| self.by_name.get(name))
    }

    /// A snapshot of `by_name` (with its store revisions), indexed by sink.
    pub fn new(
        by_name: BTreeMap<String, Destination>,
        revisions: BTreeMap<String, i64>,
    ) -> Snapshot {
        let mut by_sink: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for d in by_name.values() {
            by_sink
                .entry(d.sink.clone())
                .or_default()
                .push(d.name.clone());
        }
        Snapshot {
            by_name,
            revisions,
            by_sink,
        }
    }
}
