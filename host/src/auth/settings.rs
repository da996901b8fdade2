//! The settings of producer authentication, as `outboxd.toml` writes
//! them: `[producers]` ([`ProducersConfig`]). `crate::config` gathers them
//! with every other room's settings and applies the rule that needs the
//! listen address ([`ProducersConfig::mode_for`]).
//!
//! Must never: import `crate::config` (it imports these).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Whether `POST /v1/events` (and a bearer token on the awareness
/// `/ingest`) needs a producer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProducerAuth {
    /// Every request carries a valid producer token; 401 otherwise.
    Required,
    /// A request without `Authorization` is taken anonymously; one with a
    /// token is checked like `required` (a wrong token is still 401). The
    /// default on a loopback listener; beyond loopback only when written
    /// out, for a trusted network, with a warning at every start.
    Optional,
}

/// `[producers]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ProducersConfig {
    /// `required` or `optional`. Unset: `optional` when `listen` is a
    /// loopback address; beyond loopback the daemon refuses to start until
    /// it is written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<ProducerAuth>,
    /// Events per second a producer may post when its record sets no rate
    /// of its own (its burst is this or `ingest.max-batch-items`, whichever
    /// is larger, so any request ingest accepts can pass). Default 1000.
    pub rate_per_second: u32,
}

impl Default for ProducersConfig {
    fn default() -> Self {
        ProducersConfig {
            auth: None,
            rate_per_second: 1000,
        }
    }
}

impl ProducersConfig {
    /// The mode in force for a listener on `listen`. `Err` (key, problem)
    /// when `auth` is unset and `listen` is beyond loopback.
    pub fn mode_for(&self, listen: SocketAddr) -> Result<ProducerAuth, (String, String)> {
        match self.auth {
            Some(mode) => Ok(mode),
            None if listen.ip().is_loopback() => Ok(ProducerAuth::Optional),
            None => Err((
                "producers.auth".into(),
                format!(
                    "listen is {listen} (not loopback): set producers.auth = \"required\" \
                     (OUTBOXD_PRODUCERS__AUTH=required) and create producers with `outboxd \
                     producers create NAME`, or producers.auth = \"optional\" to take anonymous \
                     posts on a trusted network"
                ),
            )),
        }
    }
}
