//! `[console]`: whether `outboxd run` serves the console, where, and how.
//!
//! Owns: the console's knobs, their defaults and their checks. Must never:
//! hold the admin token (the console reads `admin.token`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default `console.session-ttl`: a working day.
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// `[console]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ConsoleConfig {
    /// Serve the console. Default on; it answers only after a login with
    /// `admin.token`, and with no token set nobody can log in.
    pub enabled: bool,
    /// Path the console lives under, e.g. `/console` (the default): starts
    /// with `/`, no trailing `/`, letters, digits, `-`, `_`, `/` only.
    pub prefix: String,
    /// Show everything, change nothing: every action is hidden and refused.
    pub read_only: bool,
    /// How long a login lasts ("12h", "30m"). Default 12 h.
    #[serde(with = "humantime_serde")]
    pub session_ttl: Duration,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: true,
            prefix: "/console".into(),
            read_only: false,
            session_ttl: DEFAULT_SESSION_TTL,
        }
    }
}

impl ConsoleConfig {
    /// Check the values; `Err((key, problem))` names the key under
    /// `console.`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let p = &self.prefix;
        let well_formed = p.len() > 1
            && p.starts_with('/')
            && !p.ends_with('/')
            && !p.contains("//")
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_'));
        if !well_formed {
            return Err((
                "prefix".into(),
                format!(
                    "{p:?} is not a path such as \"/console\" (starts with /, no trailing /, letters, digits, -, _)"
                ),
            ));
        }
        if ["/v1", "/health", "/ready", "/metrics", "/ingest"]
            .iter()
            .any(|taken| p == taken || p.starts_with(&format!("{taken}/")))
        {
            return Err((
                "prefix".into(),
                format!("{p:?} is a path of the daemon's own API; pick another, e.g. \"/console\""),
            ));
        }
        if self.session_ttl.is_zero() {
            return Err(("session-ttl".into(), "must be greater than 0".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_prefix(prefix: &str) -> Result<(), (String, String)> {
        ConsoleConfig {
            prefix: prefix.into(),
            ..ConsoleConfig::default()
        }
        .validate()
    }

    #[test]
    fn a_prefix_is_a_plain_path_apart_from_the_api() {
        assert!(with_prefix("/console").is_ok());
        assert!(with_prefix("/ops/console-2").is_ok());
        for bad in [
            "",
            "/",
            "console",
            "/console/",
            "/a//b",
            "/v1",
            "/v1/console",
            "/metrics",
            "/c?x",
        ] {
            let (key, _) = with_prefix(bad).unwrap_err();
            assert_eq!(key, "prefix", "{bad:?}");
        }
        let zero = ConsoleConfig {
            session_ttl: Duration::ZERO,
            ..ConsoleConfig::default()
        };
        assert_eq!(zero.validate().unwrap_err().0, "session-ttl");
    }
}
