//! The Neo4j outbox relay (`[sources.NAME] kind = "neo4j"`).
//!
//! Applications write an outbox node (label `AwarenessOutbox` by default)
//! in the same transaction as each mutation: `eventId`, `packetId` (the
//! stream), `streamVersion` (its gapless position, from a per-stream
//! counter node), `status = 'pending'`, `attempts`, `nextAttemptAt`,
//! `createdAt`, the event's type and a JSON payload. This relay claims
//! those nodes, ingests each into outboxd's store (event id = `eventId`,
//! producer sequence = `streamVersion`) and finishes it fenced by its lease
//! token.
//!
//! Owns: the lock-first claim, safe with any number of relays and replicas.
//! Neo4j locks a node only when a transaction writes it, after a filter has
//! read it, so a filter-then-set claim lets concurrent relays claim the same
//! node. The claim therefore:
//!
//! 1. shortlists read-only the heads of streams (no earlier version of the
//!    stream pending, failed or in flight): the next heads of the streams
//!    it just finished, then per lane (pending; failed and due; in flight
//!    with an expired lease), keyset-paged on the `(status, eventId)` index
//!    (never `SKIP`), then, when the lanes meet nodes behind their heads,
//!    stream by stream over the `(stream, status, version)` index;
//! 2. in one write transaction over at most `batch-size` shortlisted nodes,
//!    first writes a throwaway property on each (taking its write lock),
//!    then re-checks eligibility and the predecessors, then sets `status =
//!    'inflight'`, a fresh lease token, the lease expiry (database clock)
//!    and counts the attempt.
//!
//! Every finish matches `{eventId, leaseToken}`: a relay whose lease was
//! taken over changes nothing (counted as `lease_lost`). Statuses:
//! `pending`, `inflight`, `delivered`, `failed` (retried at
//! `nextAttemptAt`), `dead` (refused for good: bad node or conflicting
//! content; the reason is in `lastError`). Delivered nodes older than the
//! retention are deleted in bounded batches.
//!
//! Must never: set a node's status without holding its lock and having
//! re-read it, ingest version n+1 of a stream before version n, run a query
//! that is not index-backed (the indexes are created at start) or that
//! sorts what an index could give in order, or log the password.

// The imports and constants of this file serve the whole folder: each
// file of it opens with `use super::*`.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use neo4rs::{query, Graph, Query};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::watch;

use super::{Source, SourceConfig, SourceContext, SourceError, StatusHandle};
use crate::backoff::Backoff;
use crate::event::NewEvent;
use crate::store::IngestError;

mod config;
mod mapping;
mod outbox;
mod queries;
mod relay;

pub use config::*;
use mapping::*;
pub use outbox::*;
pub use queries::*;
pub use relay::*;

/// The shortlist lane of waiting nodes (and outboxd's default word for
/// the state, [`StatusWords`]).
pub const PENDING: &str = "pending";
/// The lane of in-flight nodes whose lease expired.
pub const INFLIGHT: &str = "inflight";
/// The lane of failed nodes that are due.
pub const FAILED: &str = "failed";

/// Most rounds of retention deletes in one cycle.
const RETENTION_ROUNDS: u32 = 10;
/// How often retention runs (more often when the retention is shorter).
const RETENTION_EVERY: Duration = Duration::from_secs(10);
/// How often nodes without a usable event id are looked for.
const MISSING_ID_EVERY: Duration = Duration::from_secs(30);
/// Most such nodes marked dead per sweep.
const MISSING_ID_BATCH: i64 = 100;
/// How often the oldest pending age is measured.
const OLDEST_EVERY: Duration = Duration::from_secs(5);
/// Most times a claim transaction is retried on a transient error
/// (deadlock, lock timeout): explicit transactions are not retried by the
/// driver.
const CLAIM_RETRIES: u32 = 5;

/// Streams found per walk query ([`Queries::walk`]): one index seek each,
/// 16 in one round trip (about 7 ms at 200,000 nodes, 2026-12-03).
const WALK_STEPS: usize = 16;

#[async_trait::async_trait]
impl Source for Neo4jSourceConfig {
    fn kind(&self) -> &'static str {
        "neo4j"
    }

    fn validate(&self) -> Result<(), (String, String)> {
        Neo4jSourceConfig::validate(self)
    }

    fn redacted(&self) -> SourceConfig {
        SourceConfig::Neo4j(self.clone()) // the password is an env name
    }

    fn stale_after(&self) -> Option<Duration> {
        Some(stale_after(self))
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

impl From<OutboxError> for SourceError {
    fn from(e: OutboxError) -> SourceError {
        match e {
            OutboxError::Neo4j { .. } | OutboxError::Timeout { .. } | OutboxError::Shape { .. } => {
                SourceError::Upstream(Box::new(e))
            }
            OutboxError::Ingest(_) => SourceError::Store(Box::new(e)),
            OutboxError::Config(_) => SourceError::Config(Box::new(e)),
        }
    }
}
