//! The settings of routing, as `outboxd.toml` writes them: `[[routes]]`
//! ([`Route`]). `crate::config` gathers them with every other room's
//! settings.
//!
//! Must never: import `crate::config` (it imports these), or read the
//! environment.

use serde::{Deserialize, Serialize};

/// A route: events whose `type` matches one of `types` (and whose stream
/// matches one of `streams`, when given) get one delivery per sink named in
/// `sinks`. Patterns are globs where `*` matches any run of characters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Route {
    /// Event type patterns, e.g. `["com.github.issues.*"]`. Default `["*"]`.
    #[serde(default = "match_all")]
    pub types: Vec<String>,
    /// Stream patterns. Default `["*"]`.
    #[serde(default = "match_all")]
    pub streams: Vec<String>,
    /// Sink names (the `name` of a plugin manifest).
    pub sinks: Vec<String>,
}

fn match_all() -> Vec<String> {
    vec!["*".to_string()]
}

/// Check what types alone cannot in the configured `routes`.
/// `Err((key, problem))` names the key (`routes[2].sinks`).
pub fn validate(routes: &[Route]) -> Result<(), (String, String)> {
    for (i, route) in routes.iter().enumerate() {
        if route.sinks.is_empty() {
            return Err((format!("routes[{i}].sinks"), "names no sink".into()));
        }
    }
    Ok(())
}
