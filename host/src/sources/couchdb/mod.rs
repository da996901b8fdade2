//! The `couchdb` source: relays the pending outbox entries that a document
//! service keeps inside its CouchDB documents (docs/guides/sources.md,
//! `couchdb`: CouchDB document outbox).
//!
//! One run: read the credentials, check the database answers, install the
//! design document with the `pending` view when missing or outdated
//! ([`design`]), scan the whole view, then follow `_changes` (longpoll,
//! `include_docs`, `filter=_view` on the pending view) from the saved
//! checkpoint, scanning the view again every `scan-interval`. Each document
//! read is turned into events ([`mapping`]) and handed to
//! [`crate::ingest::submit`] — idempotent on `event_id`, so
//! finding an entry again (the next scan, the feed, a restart) is a
//! duplicate success.
//!
//! The checkpoint (`since` of the feed, kept in outboxd's store) is only a
//! shortcut: it is saved after the changes before it were ingested, and the
//! periodic scan finds any pending entry whatever the checkpoint says. So
//! no entry is skipped because a checkpoint moved past it, and a lost
//! checkpoint costs a re-read, not an event.
//!
//! Must never: write to CouchDB other than its own design document (the
//! `couchdb-mark` sink marks entries published), ingest an entry already
//! published or a malformed one, or let a bad document stop the relay of
//! the rest of the database.

mod client;
mod config;
mod design;
mod mapping;
mod relay;

// The imports and constants of this file serve relay.rs too, which
// opens with `use super::*`.
use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::watch;

pub use config::{CouchdbConfig, EntryPaths};
pub use relay::run;

use super::template::Template;
use super::{Source, SourceConfig, SourceContext, SourceError, StatusHandle};
use crate::event::NewEvent;
use crate::store::{IngestError, StoreError};
use client::{Changes, Client, CouchError};

/// Why a run of the source stopped (it is started again after a backoff).
#[derive(Debug, thiserror::Error)]
pub enum CouchdbError {
    /// CouchDB unreachable, or an answer it should not have given.
    #[error("{0}")]
    Couch(#[from] CouchError),
    /// outboxd's own store failed (saving the checkpoint or ingesting).
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// outboxd's own store gave no answer within this time (`db-timeout`).
    #[error("store: no answer within {0:?}")]
    StoreTimeout(Duration),
    /// A setting is unusable at run time (the message names the key).
    #[error("configuration: {0}")]
    Config(String),
}

/// Most (document, revision) pairs remembered as already reported
/// malformed, so a bad entry is logged and counted once per revision, not
/// on every scan.
const MALFORMED_MEMORY: usize = 10_000;

/// Slack added to the freshness limits of the readiness checks.
const CHECK_SLACK: Duration = Duration::from_secs(5);

/// How long the `couchdb_reachable` and `feed_following` checks may go
/// unrenewed: a feed wait plus two requests, and the slack.
fn live_after(config: &CouchdbConfig) -> Duration {
    config.feed_timeout + config.request_timeout * 2 + CHECK_SLACK
}

#[async_trait::async_trait]
impl Source for CouchdbConfig {
    fn kind(&self) -> &'static str {
        "couchdb"
    }

    fn validate(&self) -> Result<(), (String, String)> {
        CouchdbConfig::validate(self)
    }

    fn redacted(&self) -> SourceConfig {
        SourceConfig::Couchdb(self.clone()) // credentials are env names
    }

    fn stale_after(&self) -> Option<Duration> {
        Some(live_after(self))
    }

    async fn run(
        &self,
        name: &str,
        ctx: &SourceContext,
        status: &StatusHandle,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), SourceError> {
        Ok(relay::run(name, self, ctx, status, shutdown).await?)
    }
}

impl From<CouchdbError> for SourceError {
    fn from(e: CouchdbError) -> SourceError {
        match e {
            CouchdbError::Couch(_) => SourceError::Upstream(Box::new(e)),
            CouchdbError::Store(_) | CouchdbError::StoreTimeout(_) => {
                SourceError::Store(Box::new(e))
            }
            CouchdbError::Config(_) => SourceError::Config(Box::new(e)),
        }
    }
}
