//! Destinations: the configured targets of a sink, kept in the store and
//! managed while running.
//!
//! A plugin is the code that talks to a kind of target; a destination is
//! one configured target of it — its own configuration (merged over the
//! manifest's `[config]`), filters, signing secret, retry override, rate
//! limit, in-flight cap and state. A destination's name is its **delivery
//! key**: its deliveries, heads, attempts, retry windows and dead letters
//! are stored under it, so order is per (destination, stream) and one
//! destination never holds back another. A sink with no destinations is
//! served as one destination named after the sink, as before.
//!
//! Owns: the stored [`Destination`] record and its [`Filter`]; the live
//! [`Snapshot`] every replica routes by ([`live`]); the admin actions
//! ([`actions`]); per-destination health and automatic disable
//! ([`health`]); secrets ([`secret`]) and their sealing at rest
//! ([`sealing`]).
//!
//! Must never: print a secret (records are redacted by [`Destination::redacted`]
//! before they leave through the API or a log), drop deliveries of a
//! destination that is paused, disabled or deleted without `purge`.

pub mod actions;
pub mod health;
pub mod live;
pub mod sealing;
pub mod secret;
pub mod sync;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::event::{glob_match, NewEvent};

/// Longest destination name, bytes.
pub const MAX_NAME_BYTES: usize = 128;

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

/// Which events a destination takes. Every part must match; an empty list
/// matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Filter {
    /// Globs over the event's `type` (`*` any run of characters).
    pub types: Vec<String>,
    /// Globs over the event's stream (`partitionkey`).
    pub streams: Vec<String>,
    /// Attribute conditions, `NAME == GLOB` or `NAME != GLOB`, over
    /// CloudEvents attribute names (`type`, `source`, `subject`,
    /// `partitionkey`, or an extension such as `requestingplatform`). An
    /// absent attribute is equal to nothing: `==` fails, `!=` holds.
    #[serde(rename = "where")]
    pub conditions: Vec<String>,
}

/// One parsed attribute condition.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Condition {
    attribute: String,
    equal: bool,
    pattern: String,
}

impl Filter {
    /// Check every part; `Err` names the part (`filter.where[1]`) and what
    /// is wrong with it.
    pub fn validate(&self) -> Result<(), (String, String)> {
        for (key, list) in [("types", &self.types), ("streams", &self.streams)] {
            for (i, p) in list.iter().enumerate() {
                if p.is_empty() {
                    return Err((format!("filter.{key}[{i}]"), "is empty".into()));
                }
            }
        }
        for (i, c) in self.conditions.iter().enumerate() {
            parse_condition(c).map_err(|e| (format!("filter.where[{i}]"), e))?;
        }
        Ok(())
    }

    /// Whether `event` passes. Conditions that do not parse (refused at
    /// create, so only from a hand-edited row) match nothing.
    pub fn matches(&self, event: &NewEvent) -> bool {
        let any = |list: &[String], value: &str| {
            list.is_empty() || list.iter().any(|p| glob_match(p, value))
        };
        any(&self.types, &event.ty)
            && any(&self.streams, &event.stream)
            && self.conditions.iter().all(|c| match parse_condition(c) {
                Ok(c) => {
                    let value = attribute(event, &c.attribute);
                    let hit = value.is_some_and(|v| glob_match(&c.pattern, v));
                    hit == c.equal
                }
                Err(_) => false,
            })
    }
}

/// `NAME == VALUE` / `NAME != VALUE`; VALUE may be in double quotes.
fn parse_condition(text: &str) -> Result<Condition, String> {
    let (attribute, equal, value) = if let Some((a, v)) = text.split_once("!=") {
        (a, false, v)
    } else if let Some((a, v)) = text.split_once("==") {
        (a, true, v)
    } else {
        return Err(format!(
            "{text:?} is not a condition: expected `NAME == VALUE` or `NAME != VALUE`"
        ));
    };
    let attribute = attribute.trim();
    if attribute.is_empty()
        || !attribute
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(format!(
            "{attribute:?} is not a CloudEvents attribute name (lower-case letters and digits)"
        ));
    }
    let value = value.trim();
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    Ok(Condition {
        attribute: attribute.to_string(),
        equal,
        pattern: value.to_string(),
    })
}

/// The value of CloudEvents attribute `name` of `event`, as text.
fn attribute<'e>(event: &'e NewEvent, name: &str) -> Option<&'e str> {
    match name {
        "id" => Some(&event.id),
        "source" => Some(&event.source),
        "type" => Some(&event.ty),
        "subject" => event.subject.as_deref(),
        "partitionkey" => Some(&event.stream),
        "datacontenttype" => event.datacontenttype.as_deref(),
        "dataschema" => event.dataschema.as_deref(),
        "time" => event.time.as_deref(),
        other => event.extensions.get(other).map(String::as_str),
    }
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
    /// (`enc:v1:…`, see [`sealing`]).
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
    /// ([`sync`]), which may pause it when its platform leaves the list;
    /// `None` for one made by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_by: Option<String>,
}

impl Destination {
    /// The record with every secret replaced by whether it is set, and
    /// every credential `config` value (sealed or not) by `"***"` (a plain
    /// URL with a password keeps its other parts) — the only form that
    /// leaves the process (API answers, logs).
    pub fn redacted(&self) -> serde_json::Value {
        let mut shown = self.clone();
        for (key, value) in shown.config.iter_mut() {
            // `is_credential(key, "")`: by the key's name alone.
            *value = if crate::secrets::is_sealed(value) || crate::secrets::is_credential(key, "") {
                "***".into()
            } else {
                crate::redact::redact_url(value)
            };
        }
        let mut value = serde_json::to_value(&shown).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.remove("secret");
            map.remove("previous_secret");
            map.insert("has_secret".into(), self.secret.is_some().into());
            if self.previous_secret.is_none() {
                map.remove("previous_until_ms");
            }
        }
        value
    }
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

/// Unix milliseconds now, by this process's clock.
pub fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ty: &str, stream: &str, ext: &[(&str, &str)]) -> NewEvent {
        let body = serde_json::json!({
            "specversion": "1.0", "id": "e1", "source": "/s", "type": ty,
            "partitionkey": stream, "data": {}
        });
        let mut e = crate::event::parse_one(body.to_string().as_bytes()).unwrap();
        for (k, v) in ext {
            e.extensions.insert(k.to_string(), v.to_string());
        }
        e
    }

    #[test]
    fn conditions_compare_attributes_and_an_absent_one_is_unequal() {
        let f = Filter {
            conditions: vec!["requestingplatform != \"blabsy\"".into()],
            ..Default::default()
        };
        assert!(f.validate().is_ok());
        assert!(!f.matches(&event("t", "s", &[("requestingplatform", "blabsy")])));
        assert!(f.matches(&event("t", "s", &[("requestingplatform", "pictique")])));
        assert!(f.matches(&event("t", "s", &[])));
        let f = Filter {
            types: vec!["issues.*".into()],
            conditions: vec!["partitionkey == repo-*".into()],
            ..Default::default()
        };
        assert!(f.matches(&event("issues.opened", "repo-1", &[])));
        assert!(!f.matches(&event("push", "repo-1", &[])));
        assert!(!f.matches(&event("issues.opened", "other", &[])));
    }

    #[test]
    fn a_bad_condition_is_named() {
        let f = Filter {
            conditions: vec!["ok == 1".into(), "Type ~ x".into()],
            ..Default::default()
        };
        let (field, why) = f.validate().unwrap_err();
        assert_eq!(field, "filter.where[1]");
        assert!(why.contains("expected `NAME == VALUE`"), "{why}");
    }
}
