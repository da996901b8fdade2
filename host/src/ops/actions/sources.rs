//! The source action: every configured source with its status
//! (`GET /v1/admin/sources`, `outboxd sources list`).
//!
//! Owns: the typed view of a source's status ([`SourceView`]), read from
//! what `crate::sources::Statuses` reports.
//!
//! Must never: change a source, or show its credentials (the status holds
//! none).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One check of a source (`consumer_attached`, `connected`, …).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SourceCheck {
    /// Ok and renewed within its limit.
    pub ok: bool,
    /// Time since it was last set, ms.
    #[serde(default)]
    pub age_ms: u64,
    /// What it saw, or why it went stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One source as `GET /v1/admin/sources` answers and `outboxd sources
/// list` prints it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SourceView {
    /// Its name (`[sources.NAME]`).
    pub name: String,
    /// Its kind (`neo4j`, `couchdb`, `amqp`).
    pub kind: String,
    /// Ready: its last run has no error, and every check is ok and fresh.
    pub ok: bool,
    /// Why its last run failed.
    pub last_error: Option<String>,
    /// When its last cycle ended, Unix ms.
    pub last_cycle_at_ms: Option<u64>,
    /// Time since its last cycle, ms.
    pub last_cycle_age_ms: Option<u64>,
    /// Runs started again after a failure.
    pub restarts: u64,
    /// Its checks, by name.
    pub checks: BTreeMap<String, SourceCheck>,
}

/// The answer of `GET /v1/admin/sources`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sources {
    /// By name.
    pub sources: Vec<SourceView>,
}

/// Every configured source with its status, by name.
pub fn list(statuses: &crate::sources::Statuses) -> Sources {
    let sources = statuses
        .list()
        .into_iter()
        .map(|s| serde_json::from_value(s).unwrap_or_default())
        .collect();
    Sources { sources }
}
